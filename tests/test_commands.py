"""Operations commands: replay_journal, reap_stale_runs, compact_journal, export_session, doctor."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from runs import journal
from runs.journal import NewEvent, done_event
from runs.models import JournalEvent, Run
from runs.transcript import materialize
from tests import factories

pytestmark = pytest.mark.django_db


def run_cmd(*args: Any) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


@pytest.fixture
def finished_run() -> Run:
    run = factories.RunFactory(status="running", prompt_text="Explain it")
    journal.append_batch(
        run.pk,
        [
            NewEvent("run.started", {"status": "running"}),
            NewEvent("token.delta", {"message_id": "m1", "delta": "Hello "}),
            NewEvent("token.delta", {"message_id": "m1", "delta": "world"}),
            NewEvent("tool.started", {"tool_call_id": "t1", "title": "ls", "status": "in_progress"}),
            NewEvent("tool.done", {"tool_call_id": "t1", "status": "completed"}),
            NewEvent("token.delta", {"message_id": "m2", "delta": "Done "}),
            NewEvent("token.delta", {"message_id": "m2", "delta": "now."}),
            done_event("completed", stop_reason="end_turn"),
        ],
    )
    run.refresh_from_db()
    return run


def test_replay_journal_prints_events_after_the_cursor(finished_run: Run) -> None:
    out = run_cmd("replay_journal", finished_run.pk, "--after-seq", "5")
    lines = out.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["6", "7", "8"]


def test_replay_journal_jsonl_emits_envelopes(finished_run: Run) -> None:
    out = run_cmd("replay_journal", finished_run.pk, "--format", "jsonl")
    envelopes = [json.loads(line) for line in out.strip().splitlines()]
    assert [e["seq"] for e in envelopes] == list(range(1, 9))
    assert envelopes[-1]["terminal"] and envelopes[0]["event_id"] == f"{finished_run.pk}:1"


def test_replay_journal_markdown_is_the_materialized_transcript(finished_run: Run) -> None:
    out = run_cmd("replay_journal", finished_run.pk, "--format", "markdown")
    assert "Hello world" in out and "Done now." in out and "`ls`" in out


def test_replay_journal_follow_returns_at_the_terminal_event(finished_run: Run) -> None:
    out = run_cmd("replay_journal", finished_run.pk, "--follow")
    assert out.strip().splitlines()[-1].split()[1] == "done"


def test_replay_journal_refuses_a_cursor_ahead(finished_run: Run) -> None:
    with pytest.raises(CommandError, match="cursor_ahead"):
        run_cmd("replay_journal", finished_run.pk, "--after-seq", "99")


def test_compaction_merges_deltas_and_keeps_the_transcript(finished_run: Run) -> None:
    before = materialize(JournalEvent.objects.filter(run=finished_run).order_by("seq"))
    Run.objects.filter(pk=finished_run.pk).update(finished_at=timezone.now() - timedelta(days=30))
    out = run_cmd("compact_journal", "--older-than", "7")
    assert "removed 2 event row(s)" in out
    after_events = list(JournalEvent.objects.filter(run=finished_run).order_by("seq"))
    assert [e.type for e in after_events].count("token.delta") == 2
    after = materialize(after_events)
    assert after["items"] == before["items"] and after["terminal_state"] == "completed"
    finished_run.refresh_from_db()
    with pytest.raises(journal.CursorExpired):
        journal.read_after(finished_run, 3)
    assert journal.read_after(finished_run, 0)  # from the start still works


def test_compaction_leaves_recent_runs_alone(finished_run: Run) -> None:
    assert "compacted 0 run(s)" in run_cmd("compact_journal", "--older-than", "7")


def test_reap_stale_runs_dry_run_then_for_real() -> None:
    run = factories.RunFactory(
        status="running", lease_owner="ghost", lease_expires_at=timezone.now() - timedelta(seconds=5)
    )
    assert "would interrupt run" in run_cmd("reap_stale_runs", "--dry-run")
    run.refresh_from_db()
    assert run.status == "running"
    assert f"interrupted run {run.pk}" in run_cmd("reap_stale_runs")
    run.refresh_from_db()
    assert run.status == "interrupted"


def test_export_session_as_markdown_and_json(finished_run: Run) -> None:
    session = finished_run.session
    md = run_cmd("export_session", session.pk, "--format", "markdown")
    assert "Explain it" in md and "Hello world" in md
    data = json.loads(run_cmd("export_session", session.pk, "--format", "json"))
    assert data["turns"][0]["state"]["text"] == "Hello worldDone now."


def test_export_session_unknown_id_is_an_error() -> None:
    with pytest.raises(CommandError, match="does not exist"):
        run_cmd("export_session", 999999)


def test_doctor_checks_the_demo_agent_for_real() -> None:
    out = io.StringIO()
    try:
        call_command("doctor", stdout=out)
    except CommandError:
        pytest.fail(out.getvalue())
    out = out.getvalue()
    assert "agent 'demo': hermesweb-demo" in out
    assert "database" in out and "migrated" in out


def test_bootstrap_creates_a_login_and_a_demo_project_once(settings: Any) -> None:
    from django.contrib.auth import get_user_model

    from projects.models import Project

    first = run_cmd("bootstrap")
    second = run_cmd("bootstrap")
    assert "sign in as 'admin'" in first and "sign in as 'admin'" in second
    assert get_user_model().objects.filter(is_superuser=True).count() == 1
    assert Project.objects.get().agent == settings.HERMESWEB_DEFAULT_AGENT
