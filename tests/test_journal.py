"""The journal: seq assignment, the single terminal event, cursors, materialization, redaction."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from runs import journal
from runs.journal import NewEvent
from runs.models import JournalEvent, Run, RunStatus
from runs.redaction import REDACTED, redact
from runs.transcript import materialize
from tests.factories import RunFactory, run_with_events
from tests.support.runs import append_event

pytestmark = pytest.mark.django_db

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parent.parent


def fixture_events(name: str = "journal_tool_turn.json") -> list[NewEvent]:
    data = json.loads((FIXTURES / name).read_text())
    return [NewEvent(e["type"], e["payload"]) for e in data["events"]]


def fixture_run() -> Run:
    run = RunFactory(status=RunStatus.RUNNING)
    journal.append_batch(run.pk, fixture_events(), publish=False)
    run.refresh_from_db()
    return run


def seqs(run: Run) -> list[int]:
    return list(JournalEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))


# ---------------------------------------------------------------- append


def test_it_numbers_events_from_one_without_gaps_across_batches() -> None:
    run = RunFactory()
    first = append_event(run.pk, "progress", {"text": "a"})
    batch = journal.append_batch(run.pk, [NewEvent("progress", {"text": str(i)}) for i in range(3)])

    assert first.seq == 1
    assert [e.seq for e in batch] == [2, 3, 4]
    assert seqs(run) == [1, 2, 3, 4]
    run.refresh_from_db()
    assert run.last_seq == 4
    assert run.last_event_id == f"{run.pk}:4"


def test_it_gives_each_run_its_own_sequence() -> None:
    one, two = RunFactory(), RunFactory()
    append_event(one.pk, "progress")
    append_event(one.pk, "progress")
    event = append_event(two.pk, "progress")

    assert event.seq == 1
    assert event.event_id == f"{two.pk}:1"


def test_it_writes_run_updates_in_the_same_transaction() -> None:
    run = RunFactory()
    append_event(run.pk, "run.started", {"status": "running"}, status=RunStatus.RUNNING)

    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING
    assert run.last_seq == 1


def test_an_empty_batch_appends_nothing() -> None:
    run = RunFactory()
    assert journal.append_batch(run.pk, []) == []
    run.refresh_from_db()
    assert run.last_seq == 0


def test_the_envelope_is_artifact_1_exactly() -> None:
    run = RunFactory()
    event = append_event(run.pk, "tool.updated", {"tool_call_id": "t1"})

    envelope = event.envelope()
    assert set(envelope) == {
        "event_id",
        "seq",
        "run_id",
        "session_id",
        "type",
        "created_at",
        "terminal",
        "payload",
    }
    assert envelope["event_id"] == f"{run.pk}:1"
    assert envelope["session_id"] == run.session_id
    assert isinstance(envelope["created_at"], float)
    assert envelope["terminal"] is False


# ---------------------------------------------------------------- terminal


def test_done_ends_the_run_and_sets_its_terminal_state() -> None:
    run = RunFactory(status=RunStatus.RUNNING, lease_owner="runner-1")
    rows = journal.append_batch(
        run.pk,
        [NewEvent("token.delta", {"delta": "ok"}), journal.done_event("completed", stop_reason="end_turn")],
    )

    assert rows[-1].terminal is True
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert run.finished_at is not None
    assert run.lease_owner == ""


def test_it_refuses_a_second_terminal_event() -> None:
    run = RunFactory(status=RunStatus.RUNNING)
    journal.append_batch(run.pk, [journal.done_event("cancelled")])

    with pytest.raises(journal.AlreadyTerminal):
        journal.append_batch(run.pk, [journal.done_event("completed")])
    with pytest.raises(journal.AlreadyTerminal):
        append_event(run.pk, "progress")
    assert seqs(run) == [1]


def test_it_refuses_a_done_event_that_is_not_last_in_its_batch() -> None:
    run = RunFactory()
    with pytest.raises(ValueError, match="last"):
        journal.append_batch(run.pk, [journal.done_event("completed"), NewEvent("progress")])
    assert seqs(run) == []


def test_it_refuses_an_unknown_terminal_state() -> None:
    with pytest.raises(ValueError, match="terminal state"):
        journal.done_event("paused")


def test_a_cancelling_run_keeps_its_status_until_the_terminal_event() -> None:
    run = RunFactory(status=RunStatus.CANCELLING)
    append_event(run.pk, "status", {"status": "running"}, status=RunStatus.RUNNING)
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLING

    journal.append_batch(run.pk, [journal.done_event("cancelled")])
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED


# ---------------------------------------------------------------- read_after


def test_read_after_returns_events_strictly_after_the_cursor() -> None:
    run = run_with_events([("progress", {"text": str(i)}) for i in range(5)])

    assert [e.seq for e in journal.read_after(run, 0)] == [1, 2, 3, 4, 5]
    assert [e.seq for e in journal.read_after(run, 3)] == [4, 5]
    assert journal.read_after(run, 5) == []


def test_read_after_pages_by_limit_and_caps_it(settings: Any) -> None:
    run = run_with_events([("progress", {}) for _ in range(5)])
    settings.HERMESWEB_EVENTS_PAGE_MAX = 3

    assert [e.seq for e in journal.read_after(run, 1, limit=2)] == [2, 3]
    assert [e.seq for e in journal.read_after(run, 0, limit=100)] == [1, 2, 3]


def test_encoded_pages_parse_to_exactly_the_envelopes_they_stand_for() -> None:
    run = run_with_events(
        [
            ("token.delta", {"message_id": "m", "delta": 'quote " backslash \\ newline \n tab \t'}),
            ("token.delta", {"delta": "ünïcödé — 日本語 🚀 \u2028"}),
            ("tool.updated", {"tool_call_id": "t", "raw": {"n": [1, 2.5, -3e-7, None, True], "e": {}}}),
            ("usage", {"input_tokens": 2**53, "cost": 0.1}),
        ]
    )
    journal.append_batch(run.pk, [journal.done_event("completed")], publish=False)
    run.refresh_from_db()
    # Whole seconds are stored without a fraction; microseconds must survive to the last digit.
    # (Rows as written before SQLite kept their text: the readers spell these.)
    JournalEvent.objects.filter(run=run, seq=1).update(
        created_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), envelope_json=None
    )
    JournalEvent.objects.filter(run=run, seq=2).update(
        created_at=datetime(2026, 1, 2, 3, 4, 5, 999999, tzinfo=UTC), envelope_json=None
    )

    page = journal.read_encoded(run, 0)

    expected = journal.envelopes(journal.read_after(run, 0), run.session_id)
    assert [json.loads(text) for _, _, text in page.rows] == expected
    assert [row[:2] for row in page.rows] == [(e["seq"], e["terminal"]) for e in expected]
    assert json.loads(page.json_array()) == expected
    assert (page.last_seq, page.terminal, page.has_more) == (5, True, False)


def test_encoded_pages_stop_at_upto_and_say_there_is_more(settings: Any) -> None:
    run = run_with_events([("progress", {"text": str(i)}) for i in range(6)])
    settings.HERMESWEB_EVENTS_PAGE_MAX = 4

    assert [seq for seq, _, _ in journal.read_encoded(run, 1, upto=3).rows] == [2, 3]
    page = journal.read_encoded(run, 0)
    assert [seq for seq, _, _ in page.rows] == [1, 2, 3, 4]
    assert (page.last_seq, page.terminal, page.has_more) == (6, False, True)
    with pytest.raises(journal.CursorAhead):
        journal.read_encoded(run, 7)


def test_read_after_raises_cursor_ahead_for_a_cursor_the_run_never_reached() -> None:
    run = run_with_events([("progress", {})])
    with pytest.raises(journal.CursorAhead):
        journal.read_after(run, 2)


def test_read_after_raises_cursor_ahead_for_a_negative_cursor() -> None:
    run = RunFactory()
    with pytest.raises(journal.CursorAhead):
        journal.read_after(run, -1)


def test_read_after_raises_cursor_expired_inside_the_compacted_range() -> None:
    run = run_with_events([("progress", {}) for _ in range(6)])
    Run.objects.filter(pk=run.pk).update(compacted_through=4)
    run.refresh_from_db()

    with pytest.raises(journal.CursorExpired):
        journal.read_after(run, 2)
    # Zero means "from the start": the client reloads what is retained.
    assert journal.read_after(run, 0)
    assert [e.seq for e in journal.read_after(run, 4)] == [5, 6]


def test_the_cursor_errors_carry_their_api_codes() -> None:
    assert journal.CursorAhead.code == "cursor_ahead"
    assert journal.CursorExpired.code == "cursor_expired"


# ---------------------------------------------------------------- redaction


def test_secrets_never_reach_the_journal() -> None:
    run = fixture_run()

    stored = json.dumps(list(JournalEvent.objects.filter(run=run).values_list("payload", flat=True)))
    assert "sk-ant-abcdefghijklmnopqrstuvwxyz" not in stored
    assert "ghp_abcdefghijklmnopqrstuvwxyz0123" not in stored
    assert REDACTED in stored
    tool = materialize(journal.read_after(run, 0))["tools"]["t1"]
    assert tool["arguments"]["command"] == "pytest -q"
    assert tool["arguments"]["env"]["API_KEY"] == REDACTED


SECRET_SAMPLES = [
    "Authorization: Bearer abcdefghijklmnop1234",
    "export OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwx",
    "password=hunter2hunter2",
    'DB_PASSWORD: "s3cr3t-value"',
    "postgres://app:s3cretpass@db.internal/app",
    "AKIAABCDEFGHIJKLMNOP",
    "hf_abcdefghijklmnopqrstuvwxyz",
    "xoxb-1234567890-abcdefghij",
    "github_pat_abcdefghijklmnopqrstuvwxyz",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIabc\n-----END RSA PRIVATE KEY-----",
    # IGNORECASE also matches four non-ASCII letters: long s, the Kelvin sign, dotted and dotless i.
    "pa\u017f\u017fword=hunter2hunter2",
    "to\u212aen: abcdefgh12345678",
    "BA\u017f\u0130C abcdefghijklmnop",
    "pr\u0131vate_key=abcdefgh12345678",
]


@pytest.mark.parametrize("secret", SECRET_SAMPLES)
def test_redaction_masks_secret_shapes_inside_text(secret: str) -> None:
    masked = redact({"output": f"before {secret} after"})["output"]
    assert REDACTED in masked
    assert masked.startswith("before ")


def test_redaction_masks_values_under_secret_keys_and_keeps_usage() -> None:
    payload = {
        "token": "abc",
        "client_secret": "xyz",
        "headers": {"Authorization": "anything"},
        "input_tokens": 12,
        "max_tokens": 100,
        "items": [{"password": "p"}],
    }
    assert redact(payload) == {
        "token": REDACTED,
        "client_secret": REDACTED,
        "headers": {"Authorization": REDACTED},
        "input_tokens": 12,
        "max_tokens": 100,
        "items": [{"password": REDACTED}],
    }


@pytest.mark.parametrize("secret", SECRET_SAMPLES)
@pytest.mark.parametrize("around", ["{} after", "⟦1764.5⟧ {} — déjà vu 日本 🙂", "\u0130 {} \u017f"])
def test_redaction_skips_only_passes_that_cannot_match(secret: str, around: str) -> None:
    # The substring triggers decide which patterns run: they must never skip one that would match.
    from tests.support.redaction import plainly_redacted

    text = around.format(secret)
    assert plainly_redacted(text) != text
    assert redact(text) == plainly_redacted(text)


def test_redaction_leaves_ordinary_text_alone() -> None:
    text = "Ran 3 tests in 0.2s; tokens used: 120. See docs/secret-handling.md"
    assert redact(text) == text


# ---------------------------------------------------------------- concurrency

APPENDER = """
import os, sys, time
import django
django.setup()
from runs import journal
from runs.journal import NewEvent

run_id, writer, batches, go = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
while not os.path.exists(go):
    time.sleep(0.005)
for i in range(batches):
    size = 1 + i % 3
    journal.append_batch(
        run_id, [NewEvent("progress", {"writer": writer, "i": i, "j": j}) for j in range(size)], publish=False
    )
"""


def database_url() -> str:
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{db['NAME']}"
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def append_from_two_processes(run: Run, tmp_path: Path, batches: int = 40) -> None:
    go = tmp_path / "go"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "hermesweb.settings",
        "DATABASE_URL": database_url(),
        "SECRET_KEY": "test-only",
        "HERMESWEB_DATA_DIR": str(settings.DATA_DIR),
        "REDIS_URL": "",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", APPENDER, str(run.pk), name, str(batches), str(go)],
            cwd=REPO,
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    time.sleep(0.5)  # both processes import Django and wait at the gate
    go.touch()
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err


def assert_gapless(run: Run, batches: int) -> None:
    per_writer = sum(1 + i % 3 for i in range(batches))
    rows = list(JournalEvent.objects.filter(run=run).order_by("seq").values_list("seq", "payload"))
    assert [seq for seq, _ in rows] == list(range(1, 2 * per_writer + 1))
    for writer in ("a", "b"):
        mine = [(p["i"], p["j"]) for _, p in rows if p["writer"] == writer]
        assert mine == sorted(mine), "a writer's events keep their order"
        assert len(mine) == per_writer
    by_batch: dict[tuple[str, int], list[int]] = defaultdict(list)
    for seq, payload in rows:
        by_batch[(payload["writer"], payload["i"])].append(seq)
    for batch_seqs in by_batch.values():
        assert batch_seqs == list(range(batch_seqs[0], batch_seqs[0] + len(batch_seqs))), (
            "a batch is contiguous"
        )
    run.refresh_from_db()
    assert run.last_seq == 2 * per_writer


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_concurrent_appends_from_two_processes_get_gapless_unique_seqs_on_postgres(tmp_path: Path) -> None:
    assert connection.vendor == "postgresql"
    run = RunFactory(status=RunStatus.RUNNING)
    append_from_two_processes(run, tmp_path, batches=150)
    assert_gapless(run, 150)


@pytest.mark.django_db(transaction=True)
def test_concurrent_appends_from_two_processes_get_gapless_unique_seqs(tmp_path: Path) -> None:
    """The same on whichever database is configured: SQLite serialises writers with IMMEDIATE."""
    run = RunFactory(status=RunStatus.RUNNING)
    append_from_two_processes(run, tmp_path, batches=40)
    assert_gapless(run, 40)
