"""Runs over the API: reconnect metadata, journal pages and cursors, controls."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from runs import journal
from runs.models import Control, ControlKind, Run, RunStatus
from runs.schemas import EventsPage
from tests.conftest import token_client
from tests.factories import ProjectFactory, RunFactory, SessionFactory, run_with_events
from tests.support.runs import append_event, follow_event_pages

pytestmark = pytest.mark.django_db

JSON = "application/json"

APPROVAL = (
    "approval.requested",
    {
        "approval_id": "a1",
        "title": "Run rm -rf build?",
        "options": [{"option_id": "allow", "name": "Allow"}, {"option_id": "reject", "name": "Reject"}],
    },
)
CLARIFY = ("clarify.requested", {"clarify_id": "q1", "question": "Which branch?"})


def running(session: Any, *events: tuple[str, dict[str, Any]], status: str = RunStatus.RUNNING) -> Run:
    return run_with_events([("run.started", {"status": "running"}), *events], session=session, status=status)


# ---------------------------------------------------------------- status


def test_a_queued_run_reports_its_reconnect_metadata(api: Client, session: Any) -> None:
    run = RunFactory(session=session)

    body = api.get(f"/api/runs/{run.pk}").json()

    assert body["run_id"] == run.pk
    assert body["session_id"] == session.pk
    assert body["status"] == "queued"
    assert (body["last_seq"], body["last_event_id"], body["terminal"]) == (0, None, False)
    assert body["controls"] == ["cancel"]
    assert body["pending_approval_ids"] == body["pending_clarify_ids"] == []
    assert body["created_at"] and body["started_at"] is None


def test_a_run_awaiting_approval_offers_the_approval_control_and_its_id(api: Client, session: Any) -> None:
    run = running(session, APPROVAL, status=RunStatus.AWAITING_APPROVAL)

    body = api.get(f"/api/runs/{run.pk}").json()

    assert body["status"] == "awaiting_approval"
    assert "approval" in body["controls"] and "cancel" in body["controls"]
    assert body["pending_approval_ids"] == ["a1"]
    assert body["last_event_id"] == f"{run.pk}:2"


def test_a_finished_run_reports_its_terminal_state_and_no_controls(api: Client, session: Any) -> None:
    run = running(
        session, ("usage.final", {"input_tokens": 5}), ("done", {"state": "failed", "reason": "boom"})
    )
    Run.objects.filter(pk=run.pk).update(error="boom", stop_reason="error")

    body = api.get(f"/api/runs/{run.pk}").json()

    assert (body["status"], body["terminal"], body["terminal_state"]) == ("failed", True, "failed")
    assert (body["error"], body["stop_reason"]) == ("boom", "error")
    assert body["controls"] == []
    assert body["finished_at"] is not None


@pytest.mark.parametrize("suffix", ["", "/events", "/cancel", "/approvals/a1", "/clarifications/q1"])
def test_someone_elses_run_is_a_404(api: Client, other_user: Any, suffix: str) -> None:
    theirs = RunFactory(
        session=SessionFactory(project=ProjectFactory(owner=other_user)), status=RunStatus.RUNNING
    )
    method = api.get if suffix in ("", "/events") else api.post

    response = method(
        f"/api/runs/{theirs.pk}{suffix}", {"option_id": "allow", "answer": "x"}, content_type=JSON
    )

    assert response.status_code == 404
    assert response.json() == {"code": "not_found", "message": "No such run."}
    assert not Control.objects.exists()
    theirs.refresh_from_db()
    assert theirs.status == RunStatus.RUNNING


def test_staff_may_not_read_anyone_elses_run(staff_user: Any, other_user: Any) -> None:
    theirs = RunFactory(session=SessionFactory(project=ProjectFactory(owner=other_user)))
    assert token_client(staff_user).get(f"/api/runs/{theirs.pk}").status_code == 404


@pytest.mark.parametrize("pk", ["0", str(2**63), str(10**30)])
def test_impossible_run_ids_are_404(api: Client, pk: str) -> None:
    assert api.get(f"/api/runs/{pk}").status_code == 404
    assert api.get(f"/api/runs/{pk}/events").status_code == 404
    assert api.post(f"/api/runs/{pk}/cancel").status_code == 404


# ---------------------------------------------------------------- events


def test_events_after_a_cursor_are_envelopes_in_seq_order(api: Client, session: Any) -> None:
    run = running(
        session, ("token.delta", {"message_id": "m", "delta": "a"}), ("token.delta", {"delta": "b"})
    )

    body = api.get(f"/api/runs/{run.pk}/events?after_seq=1").json()

    assert body["run_id"] == run.pk
    assert [e["seq"] for e in body["events"]] == [2, 3]
    assert body["events"][0] == {
        "event_id": f"{run.pk}:2",
        "seq": 2,
        "run_id": run.pk,
        "session_id": session.pk,
        "type": "token.delta",
        "created_at": body["events"][0]["created_at"],
        "terminal": False,
        "payload": {"message_id": "m", "delta": "a"},
    }
    assert isinstance(body["events"][0]["created_at"], float)
    assert (body["last_seq"], body["terminal"], body["has_more"]) == (3, False, False)


def test_an_events_page_is_what_its_documented_schema_says(api: Client, session: Any) -> None:
    run = running(session, ("tool.updated", {"tool_call_id": "t", "raw": {"ü": [1.5, None]}}))
    journal.append_batch(run.pk, [journal.done_event("failed", error="boom")], publish=False)

    response = api.get(f"/api/runs/{run.pk}/events")

    assert response["Content-Type"] == "application/json"
    body = response.json()
    # The body is assembled from stored JSON, not through the schema: the schema must still hold.
    assert EventsPage.model_validate(body).model_dump(mode="json") == body
    expected = journal.envelopes(journal.read_after(Run.objects.get(pk=run.pk), 0), session.pk)
    assert body["events"] == expected


def test_events_come_in_pages_with_has_more(api: Client, session: Any) -> None:
    run = running(session, *[("progress", {"text": str(i)}) for i in range(9)])

    first = api.get(f"/api/runs/{run.pk}/events?limit=4").json()
    last = api.get(f"/api/runs/{run.pk}/events?after_seq=8&limit=4").json()

    assert [e["seq"] for e in first["events"]] == [1, 2, 3, 4]
    assert first["has_more"] is True
    assert [e["seq"] for e in last["events"]] == [9, 10]
    assert last["has_more"] is False


def test_following_the_next_links_reads_every_event_once_in_order(api: Client, session: Any) -> None:
    run = running(
        session, *[("progress", {"text": str(i)}) for i in range(9)], ("done", {"state": "completed"})
    )
    pages = follow_event_pages(api, f"/api/runs/{run.pk}/events?limit=4")
    seqs = [event["seq"] for page in pages for event in page.events]
    links = [page.link for page in pages]

    assert seqs == list(range(1, 12))
    assert links == [
        f'</api/runs/{run.pk}/events?after_seq=4&limit=4>; rel="next"',
        f'</api/runs/{run.pk}/events?after_seq=8&limit=4>; rel="next"',
        None,  # the last page: has_more is false
    ]


def test_the_openapi_schema_documents_the_next_link_beside_the_page(api: Client) -> None:
    schema = api.get("/api/openapi.json").json()
    ok = schema["paths"]["/api/runs/{id}/events"]["get"]["responses"]["200"]
    assert 'rel="next"' in ok["headers"]["Link"]["description"]
    assert ok["content"]["application/json"]["schema"]["$ref"].endswith("/EventsPage")


def test_the_page_size_is_capped_by_the_server(api: Client, session: Any, settings: Any) -> None:
    settings.HERMESWEB_EVENTS_PAGE_MAX = 2
    run = running(session, ("progress", {}), ("progress", {}))

    body = api.get(f"/api/runs/{run.pk}/events?limit=1000").json()
    assert len(body["events"]) == 2
    assert body["has_more"] is True


def test_a_terminal_run_replays_its_done_event(api: Client, session: Any) -> None:
    run = running(session, ("done", {"state": "cancelled"}))

    body = api.get(f"/api/runs/{run.pk}/events?after_seq=1").json()

    assert body["events"][-1]["type"] == "done"
    assert body["events"][-1]["terminal"] is True
    assert body["terminal"] is True
    assert api.get(f"/api/runs/{run.pk}/events?after_seq=2").json() == {
        "run_id": run.pk, "events": [], "last_seq": 2, "terminal": True, "has_more": False
    }  # fmt: skip


def test_it_returns_409_for_a_cursor_ahead_of_the_journal(api: Client, session: Any) -> None:
    run = running(session)

    response = api.get(f"/api/runs/{run.pk}/events?after_seq=5")

    assert response.status_code == 409
    assert response.json()["code"] == "cursor_ahead"
    assert response.json()["details"] == {"last_seq": 1}


def test_a_cursor_no_integer_can_hold_is_ahead_too(api: Client, session: Any) -> None:
    run = running(session)
    response = api.get(f"/api/runs/{run.pk}/events?after_seq={10**30}")
    assert (response.status_code, response.json()["code"]) == (409, "cursor_ahead")


def test_it_returns_410_for_a_cursor_older_than_the_retained_events(api: Client, session: Any) -> None:
    run = running(session, *[("progress", {}) for _ in range(5)])
    Run.objects.filter(pk=run.pk).update(compacted_through=4)

    response = api.get(f"/api/runs/{run.pk}/events?after_seq=2")

    assert response.status_code == 410
    assert response.json()["code"] == "cursor_expired"


@pytest.mark.parametrize("query", ["after_seq=-1", "after_seq=abc", "limit=0", "limit=-5", "limit=x"])
def test_a_malformed_cursor_or_limit_is_a_422(api: Client, session: Any, query: str) -> None:
    run = running(session)
    response = api.get(f"/api/runs/{run.pk}/events?{query}")
    assert response.status_code == 422
    assert response.json()["code"] == "validation_error"


def test_last_event_id_resumes_like_after_seq(api: Client, session: Any) -> None:
    run = running(session, ("progress", {}), ("progress", {}))

    resumed = api.get(f"/api/runs/{run.pk}/events", headers={"Last-Event-ID": f"{run.pk}:2"}).json()
    other_run = api.get(f"/api/runs/{run.pk}/events", headers={"Last-Event-ID": "999:2"}).json()
    explicit = api.get(
        f"/api/runs/{run.pk}/events?after_seq=0", headers={"Last-Event-ID": f"{run.pk}:2"}
    ).json()

    assert [e["seq"] for e in resumed["events"]] == [3]
    assert [e["seq"] for e in other_run["events"]] == [1, 2, 3]
    assert [e["seq"] for e in explicit["events"]] == [1, 2, 3]


# ---------------------------------------------------------------- cancel


def test_cancelling_a_queued_run_ends_it_at_once(api: Client, session: Any) -> None:
    run = RunFactory(session=session)

    body = api.post(f"/api/runs/{run.pk}/cancel").json()

    assert (body["accepted"], body["status"]) == (True, "accepted")
    assert body["event_id"] == f"{run.pk}:1"
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED


def test_cancelling_a_running_run_records_a_control_and_a_repeat_is_a_duplicate(
    api: Client, session: Any
) -> None:
    run = running(session)

    first = api.post(f"/api/runs/{run.pk}/cancel").json()
    again = api.post(f"/api/runs/{run.pk}/cancel").json()

    assert (first["accepted"], first["status"]) == (True, "accepted")
    assert (again["accepted"], again["status"]) == (False, "duplicate")
    assert Control.objects.filter(run=run, kind=ControlKind.CANCEL).count() == 1
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLING
    assert "cancel" not in api.get(f"/api/runs/{run.pk}").json()["controls"]


def test_cancelling_a_finished_run_is_answered_not_active_with_200(api: Client, session: Any) -> None:
    run = running(session, ("done", {"state": "completed"}))

    response = api.post(f"/api/runs/{run.pk}/cancel")

    assert response.status_code == 200
    assert response.json()["status"] == "not_active"
    assert response.json()["accepted"] is False


# ---------------------------------------------------------------- approvals and clarifications


def test_an_approval_answer_is_accepted_once_then_duplicate_then_conflict(api: Client, session: Any) -> None:
    run = running(session, APPROVAL, status=RunStatus.AWAITING_APPROVAL)
    url = f"/api/runs/{run.pk}/approvals/a1"

    first = api.post(url, {"option_id": "allow"}, content_type=JSON).json()
    same = api.post(url, {"option_id": "allow"}, content_type=JSON).json()
    different = api.post(url, {"option_id": "reject"}, content_type=JSON).json()

    assert [first["status"], same["status"], different["status"]] == ["accepted", "duplicate", "conflict"]
    assert first["accepted"] is True
    control = Control.objects.get(run=run, kind=ControlKind.APPROVAL)
    assert (control.target_id, control.payload) == ("a1", {"option_id": "allow"})


def test_an_approval_with_an_option_not_offered_is_a_422(api: Client, session: Any) -> None:
    run = running(session, APPROVAL, status=RunStatus.AWAITING_APPROVAL)

    response = api.post(f"/api/runs/{run.pk}/approvals/a1", {"option_id": "always"}, content_type=JSON)

    assert response.status_code == 422
    assert response.json()["code"] == "invalid_option"
    assert not Control.objects.exists()


def test_an_answer_to_an_unknown_request_is_not_active(api: Client, session: Any) -> None:
    run = running(session)

    approval = api.post(f"/api/runs/{run.pk}/approvals/nope", {"option_id": "allow"}, content_type=JSON)
    clarify = api.post(f"/api/runs/{run.pk}/clarifications/nope", {"answer": "main"}, content_type=JSON)

    assert approval.status_code == clarify.status_code == 200
    assert approval.json()["status"] == clarify.json()["status"] == "not_active"


def test_an_answer_to_a_resolved_request_has_expired(api: Client, session: Any) -> None:
    run = running(session, APPROVAL, ("approval.resolved", {"approval_id": "a1", "outcome": "cancelled"}))

    body = api.post(f"/api/runs/{run.pk}/approvals/a1", {"option_id": "allow"}, content_type=JSON).json()
    assert body["status"] == "expired"


@pytest.mark.parametrize("answer", ["main", {"branch": "main", "force": False}])
def test_a_clarify_answer_is_recorded_for_the_runner(api: Client, session: Any, answer: Any) -> None:
    run = running(session, CLARIFY, status=RunStatus.AWAITING_CLARIFY)

    body = api.post(f"/api/runs/{run.pk}/clarifications/q1", {"answer": answer}, content_type=JSON).json()

    assert body["status"] == "accepted"
    control = Control.objects.get(run=run, kind=ControlKind.CLARIFY)
    assert control.target_id == "q1"
    assert control.payload["content"] == (answer if isinstance(answer, dict) else {"answer": answer})


@pytest.mark.parametrize(
    ("suffix", "body"),
    [
        ("/approvals/a1", {}),
        ("/approvals/a1", {"option_id": 3}),
        ("/approvals/a1", {"option_id": ""}),
        ("/clarifications/q1", {}),
        ("/clarifications/q1", {"answer": 12}),
        ("/clarifications/q1", {"answer": ["a"]}),
    ],
)
def test_a_malformed_control_body_is_a_422(
    api: Client, session: Any, suffix: str, body: dict[str, Any]
) -> None:
    run = running(session, APPROVAL, CLARIFY)
    response = api.post(f"/api/runs/{run.pk}{suffix}", body, content_type=JSON)
    assert response.status_code == 422
    assert response.json()["code"] == "validation_error"


@pytest.mark.parametrize("target", ["%00", "a%00b", "x" * 201])
def test_an_impossible_request_id_is_a_422(api: Client, session: Any, target: str) -> None:
    run = running(session)
    response = api.post(f"/api/runs/{run.pk}/approvals/{target}", {"option_id": "allow"}, content_type=JSON)
    assert response.status_code == 422


def test_controls_read_the_journal_not_a_stale_run(api: Client, session: Any) -> None:
    """The request arrived after the page loaded: the answer still finds it."""
    run = running(session)
    append_event(run.pk, *APPROVAL, status=RunStatus.AWAITING_APPROVAL)

    body = api.post(f"/api/runs/{run.pk}/approvals/a1", {"option_id": "allow"}, content_type=JSON).json()
    assert body["status"] == "accepted"
