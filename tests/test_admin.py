"""The admin as a diagnostics console: staff only; stale runs, actions, a run's page, runners, sessions."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin import helpers
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from hermesweb.views import CONTENT_SECURITY_POLICY
from runs.models import ControlKind, ControlState, JournalEvent, Run, RunStatus
from tests import factories
from tests.support.runs import assert_journal_well_formed

pytestmark = pytest.mark.django_db

RUNS = "/admin/runs/run/"


@pytest.fixture
def console(staff_user: Any) -> Client:
    """A staff member without any model permission: being staff is what opens the console."""
    client = Client()
    client.force_login(staff_user)
    return client


@pytest.fixture
def operator(staff_user: Any) -> Client:
    """The same staff member granted `runs.change_run`, which the run actions need (viewing does not)."""
    change_run = Permission.objects.get(codename="change_run", content_type__app_label="runs")
    staff_user.user_permissions.add(change_run)
    client = Client()
    client.force_login(staff_user)
    return client


def executing_run(lease_seconds: float, **fields: Any) -> Run:
    return factories.RunFactory(
        status=RunStatus.RUNNING,
        lease_owner=fields.pop("lease_owner", "runner-gone"),
        lease_expires_at=timezone.now() + timedelta(seconds=lease_seconds),
        started_at=timezone.now(),
        **fields,
    )


def finished_run(state: str = "completed", **fields: Any) -> Run:
    return factories.run_with_events(
        [
            ("run.started", {"status": "running"}),
            ("token.delta", {"message_id": "m1", "delta": "All done."}),
            ("done", {"state": state}),
        ],
        status=RunStatus.RUNNING,
        **fields,
    )


def listed(response: Any) -> set[int]:
    return {run.pk for run in response.context["cl"].result_list}


def act(client: Client, action: str, runs: list[Run], **filters: str) -> Any:
    query = "&".join(f"{k}={v}" for k, v in filters.items())
    return client.post(
        f"{RUNS}?{query}",
        {"action": action, helpers.ACTION_CHECKBOX_NAME: [r.pk for r in runs], "index": 0},
        follow=action == "mark_interrupted",
    )


# ---------------------------------------------------------------- who gets in


@pytest.mark.parametrize(
    "page",
    [
        "/admin/",
        RUNS,
        "/admin/runs/runner/",
        "/admin/runs/journalevent/",
        "/admin/runs/control/",
        "/admin/runs/agentjob/",
        "/admin/projects/session/",
        "/admin/projects/project/",
        "/admin/intents/pendingintent/",
    ],
)
def test_staff_sees_every_diagnostics_page(console: Client, page: str) -> None:
    finished_run()
    response = console.get(page)
    assert response.status_code == 200, page


def test_a_signed_in_user_who_is_not_staff_is_sent_to_the_admin_login(user: Any) -> None:
    client = Client()
    client.force_login(user)
    for page in ("/admin/", RUNS, "/admin/runs/runner/"):
        response = client.get(page)
        assert response.status_code == 302 and "/admin/login/" in response["Location"], page


def test_a_non_staff_user_cannot_run_an_action(user: Any) -> None:
    run = executing_run(-60)
    client = Client()
    client.force_login(user)
    response = act(client, "mark_interrupted", [run])
    assert response.redirect_chain[-1][0].startswith("/admin/login/")
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.last_seq == 0


def test_anonymous_visitors_are_sent_to_the_admin_login(anonymous: Client) -> None:
    response = anonymous.get(RUNS)
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_admin_pages_send_the_sites_content_security_policy(anonymous: Client, console: Client) -> None:
    run = finished_run()
    answers = [
        anonymous.get("/admin/login/"),
        console.get("/admin/"),
        console.get(RUNS),
        console.get(f"{RUNS}{run.pk}/change/"),
    ]

    for response in answers:
        assert response.status_code == 200, response.request["PATH_INFO"]
        # The pages' own: scripts only from the site, no inline script, no framing.
        assert response["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
    assert "'unsafe-inline'" not in CONTENT_SECURITY_POLICY


# ---------------------------------------------------------------- the runs list


def test_the_runs_list_flags_stale_runs_and_shows_the_lease_holder(console: Client) -> None:
    stale = executing_run(-60, lease_owner="runner-dead")
    executing_run(60, lease_owner="runner-alive")
    response = console.get(RUNS)
    body = response.content.decode()
    assert "runner-dead (expired" in body and "runner-alive (expires in" in body
    row = response.context["cl"].model_admin
    assert row.stale(stale) is True


def test_the_stale_filter_lists_only_executing_runs_whose_lease_expired(console: Client) -> None:
    stale = executing_run(-60)
    executing_run(60)
    finished_run()
    assert listed(console.get(f"{RUNS}?condition=stale")) == {stale.pk}


def test_the_interrupted_and_failed_filters(console: Client) -> None:
    interrupted = finished_run("interrupted")
    failed = finished_run("failed")
    finished_run("completed")
    assert listed(console.get(f"{RUNS}?condition=interrupted")) == {interrupted.pk}
    assert listed(console.get(f"{RUNS}?condition=failed")) == {failed.pk}


# ---------------------------------------------------------------- actions


def test_mark_interrupted_journals_error_and_done_and_leaves_finished_runs_alone(operator: Client) -> None:
    stale = executing_run(-60)
    done = finished_run()
    before = list(JournalEvent.objects.filter(run=done).values_list("seq", "type"))
    response = act(operator, "mark_interrupted", [stale, done])
    assert response.status_code == 200
    message = " ".join(str(m) for m in response.context["messages"])
    assert "Marked 1 run(s) interrupted." in message and "1 had already finished" in message
    stale.refresh_from_db()
    assert stale.status == RunStatus.INTERRUPTED
    assert_journal_well_formed(stale)
    error, terminal = JournalEvent.objects.filter(run=stale).order_by("seq")
    assert error.type == "error" and error.payload["code"] == "operator_interrupted"
    assert terminal.type == "done" and terminal.payload["state"] == "interrupted"
    assert "root" in terminal.payload["reason"]  # who did it
    assert list(JournalEvent.objects.filter(run=done).values_list("seq", "type")) == before


def test_mark_interrupted_twice_writes_one_terminal_event(operator: Client) -> None:
    stale = executing_run(-60)
    act(operator, "mark_interrupted", [stale])
    act(operator, "mark_interrupted", [stale])
    assert JournalEvent.objects.filter(run=stale, terminal=True).count() == 1


def test_export_journal_downloads_the_envelopes_of_the_selected_runs(operator: Client) -> None:
    first, second = finished_run(), finished_run("failed")
    finished_run()  # not selected
    response = act(operator, "export_journal", [second, first])
    assert response.status_code == 200
    assert response["Content-Type"] == "application/x-ndjson"
    assert response["Content-Disposition"].startswith('attachment; filename="journal-')
    envelopes = [json.loads(line) for line in response.content.decode().splitlines()]
    assert [(e["run_id"], e["seq"]) for e in envelopes] == [
        (run.pk, seq) for run in (first, second) for seq in (1, 2, 3)
    ]
    assert set(envelopes[0]) == {
        "event_id",
        "seq",
        "run_id",
        "session_id",
        "type",
        "created_at",
        "terminal",
        "payload",
    }
    assert envelopes[0]["session_id"] == first.session_id and envelopes[2]["terminal"] is True


# ---------------------------------------------------------------- a run's page


@pytest.fixture
def long_run() -> Run:
    """150 events: a first page of 100 and a second of 50; a tool, an approval answered by a control."""
    deltas = [("token.delta", {"message_id": "m1", "delta": f"w{i} "}) for i in range(143)]
    run = factories.run_with_events(
        [
            ("run.started", {"status": "running"}),
            *deltas,
            ("tool.started", {"tool_call_id": "t1", "title": "List files", "status": "in_progress"}),
            ("tool.done", {"tool_call_id": "t1", "status": "completed"}),
            ("approval.requested", {"approval_id": "ap-1", "title": "Write x", "options": []}),
            ("approval.resolved", {"approval_id": "ap-1", "option_id": "allow_once", "outcome": "selected"}),
            ("usage.final", {"inputTokens": 3}),
            ("done", {"state": "completed", "stop_reason": "end_turn"}),
        ],
        status=RunStatus.RUNNING,
        prompt_text="Please **list** the files",
    )
    factories.ControlFactory(
        run=run,
        kind=ControlKind.APPROVAL,
        target_id="ap-1",
        state=ControlState.APPLIED,
        result="accepted",
        message="Answer delivered.",
    )
    return run


def test_a_run_page_shows_the_transcript_controls_and_the_first_page_of_events(
    console: Client, long_run: Run
) -> None:
    response = console.get(f"{RUNS}{long_run.pk}/change/")
    assert response.status_code == 200
    body = response.content.decode()
    assert "<strong>list</strong>" in body  # the prompt, rendered
    assert "w0 w1 w2" in body and "w142" in body  # the text, materialized from 143 deltas
    assert "List files" in body and "allow_once" in body
    assert "Answer delivered." in body  # the control's result
    assert [row["seq"] for row in response.context["event_rows"]] == list(range(1, 101))
    assert "page 1 of 2" in body


def test_the_next_page_of_events(console: Client, long_run: Run) -> None:
    response = console.get(f"{RUNS}{long_run.pk}/change/?events_page=2")
    assert [row["seq"] for row in response.context["event_rows"]] == list(range(101, 151))


def test_a_run_page_is_read_only(console: Client, long_run: Run) -> None:
    response = console.get(f"{RUNS}{long_run.pk}/change/")
    assert response.context["has_change_permission"] is False
    posted = console.post(f"{RUNS}{long_run.pk}/change/", {"status": "queued"})
    assert posted.status_code == 403
    long_run.refresh_from_db()
    assert long_run.status == RunStatus.COMPLETED


# ---------------------------------------------------------------- runners and sessions


def test_the_runner_registry_shows_heartbeats_and_who_is_alive(console: Client) -> None:
    alive = factories.RunnerFactory(id="runner-up")
    factories.RunnerFactory(id="runner-silent", heartbeat_at=timezone.now() - timedelta(minutes=5))
    executing_run(60, lease_owner="runner-up")
    response = console.get("/admin/runs/runner/")
    body = response.content.decode()
    assert "runner-up" in body and "runner-silent" in body and "5\xa0minutes ago" in body
    assert {r.pk for r in response.context["cl"].result_list} == {"runner-up", "runner-silent"}
    assert {r.pk for r in console.get("/admin/runs/runner/?alive=yes").context["cl"].result_list} == {
        alive.pk
    }
    page = console.get("/admin/runs/runner/runner-up/change/")
    assert page.status_code == 200 and page.context["original"].held_count == 1


def test_a_session_page_lists_its_runs_and_its_intents(console: Client, session: Any) -> None:
    run = finished_run(session=session, prompt_text="First question")
    factories.PendingIntentFactory(session=session, text="Then run the tests.")
    response = console.get(f"/admin/projects/session/{session.pk}/change/")
    assert response.status_code == 200
    body = response.content.decode()
    assert "First question" in body and f"/admin/runs/run/{run.pk}/change/" in body
    assert "Then run the tests." in body


def test_a_stale_run_can_be_marked_interrupted_from_its_own_page(operator: Client) -> None:
    stale = executing_run(-60)
    page = operator.get(f"{RUNS}{stale.pk}/change/")
    assert "Mark interrupted" in page.content.decode()
    response = operator.post(
        f"{RUNS}{stale.pk}/change/",
        {"CHANGE_FORM-action": "mark_interrupted", helpers.ACTION_CHECKBOX_NAME: [stale.pk]},
    )
    assert response.status_code == 302
    stale.refresh_from_db()
    assert stale.status == RunStatus.INTERRUPTED
    assert_journal_well_formed(stale)


def test_runs_can_be_found_by_id_or_prompt_text(console: Client) -> None:
    wanted = finished_run(prompt_text="Refactor the lexer")
    finished_run(prompt_text="Something else")
    assert listed(console.get(f"{RUNS}?q=lexer")) == {wanted.pk}
    assert wanted.pk in listed(console.get(f"{RUNS}?q={wanted.pk}"))
