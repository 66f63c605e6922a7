"""Sessions over the API: CRUD, messages (idempotent, queue/steer while running), transcript, goal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from intents.models import IntentKind, IntentState, PendingIntent
from projects.models import Session
from runs.models import Attachment, Control, ControlKind, Run, RunStatus
from runs.transcript import materialize
from runs.transcript_pages import page_state
from tests.conftest import token_client
from tests.factories import PendingIntentFactory, ProjectFactory, RunFactory, SessionFactory, run_with_events

pytestmark = pytest.mark.django_db

JSON = "application/json"
FIXTURES = Path(__file__).parent / "fixtures"


def send(api: Client, session: Any, **body: Any) -> Any:
    body.setdefault("client_id", "c1")
    body.setdefault("text", "Run the tests")
    return api.post(f"/api/sessions/{session.pk}/messages", body, content_type=JSON)


# ---------------------------------------------------------------- CRUD


def test_it_creates_and_lists_sessions_most_recent_first(api: Client, project: Any) -> None:
    first = api.post(f"/api/projects/{project.pk}/sessions", {"title": "First"}, content_type=JSON)
    second = api.post(f"/api/projects/{project.pk}/sessions", {}, content_type=JSON)

    assert first.status_code == second.status_code == 201
    assert first.json()["status"] == "active"
    assert first.json()["agent_session_id"] == ""
    listed = api.get(f"/api/projects/{project.pk}/sessions").json()
    assert [s["id"] for s in listed] == [second.json()["id"], first.json()["id"]]


def test_a_session_shows_its_active_run(api: Client, session: Any) -> None:
    run = RunFactory(session=session, status=RunStatus.RUNNING)

    assert api.get(f"/api/sessions/{session.pk}").json()["active_run_id"] == run.pk
    assert api.get(f"/api/projects/{session.project_id}/sessions").json()[0]["active_run_id"] == run.pk


def test_an_idle_session_has_no_active_run(api: Client, session: Any) -> None:
    RunFactory(session=session, status=RunStatus.COMPLETED)
    assert api.get(f"/api/sessions/{session.pk}").json()["active_run_id"] is None


def test_it_renames_archives_and_reactivates_a_session(api: Client, session: Any) -> None:
    url = f"/api/sessions/{session.pk}"

    assert api.patch(url, {"title": "Renamed"}, content_type=JSON).json()["title"] == "Renamed"
    assert api.patch(url, {"status": "archived"}, content_type=JSON).json()["status"] == "archived"
    assert api.patch(url, {"status": "active"}, content_type=JSON).json()["status"] == "active"
    session.refresh_from_db()
    assert session.title == "Renamed"


def test_it_refuses_an_unknown_session_status(api: Client, session: Any) -> None:
    response = api.patch(f"/api/sessions/{session.pk}", {"status": "deleted"}, content_type=JSON)
    assert response.status_code == 422
    assert response.json()["details"][0]["field"] == "status"


def test_it_deletes_an_idle_session(api: Client, session: Any) -> None:
    RunFactory(session=session, status=RunStatus.COMPLETED)

    assert api.delete(f"/api/sessions/{session.pk}").status_code == 204
    assert not Session.objects.filter(pk=session.pk).exists()


@pytest.mark.parametrize("status", [RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.AWAITING_APPROVAL])
def test_deleting_a_session_with_an_active_run_is_a_409(api: Client, session: Any, status: str) -> None:
    RunFactory(session=session, status=status)

    response = api.delete(f"/api/sessions/{session.pk}")

    assert response.status_code == 409
    assert response.json()["code"] == "conflict"
    assert Session.objects.filter(pk=session.pk).exists()


@pytest.mark.parametrize(
    ("method", "suffix"),
    [
        ("get", ""),
        ("patch", ""),
        ("delete", ""),
        ("post", "/messages"),
        ("get", "/transcript"),
        ("post", "/goal"),
    ],
)
def test_someone_elses_session_is_a_404(api: Client, other_user: Any, method: str, suffix: str) -> None:
    theirs = SessionFactory(project=ProjectFactory(owner=other_user))
    body = {"client_id": "x", "text": "hi", "action": "status", "title": "t"}

    response = getattr(api, method)(f"/api/sessions/{theirs.pk}{suffix}", body, content_type=JSON)

    assert response.status_code == 404
    assert response.json()["code"] == "not_found"
    assert not Run.objects.exists()


def test_someone_elses_project_sessions_are_a_404(api: Client, other_user: Any) -> None:
    theirs = ProjectFactory(owner=other_user)
    assert api.get(f"/api/projects/{theirs.pk}/sessions").status_code == 404
    assert api.post(f"/api/projects/{theirs.pk}/sessions", {}, content_type=JSON).status_code == 404


def test_staff_may_not_read_anyone_elses_session(staff_user: Any, other_user: Any) -> None:
    theirs = SessionFactory(project=ProjectFactory(owner=other_user))
    assert token_client(staff_user).get(f"/api/sessions/{theirs.pk}").status_code == 404


# ---------------------------------------------------------------- messages


def test_a_message_to_an_idle_session_starts_a_run(api: Client, session: Any) -> None:
    log = Attachment.objects.create(
        session=session, name="log.txt", mime_type="text/plain", size=12, sha256="0" * 64, path="unused"
    )
    response = send(api, session, text="Run the tests", attachments=[log.pk])

    assert response.status_code == 202
    body = response.json()
    assert body == {
        "kind": "run",
        "run_id": body["run_id"],
        "intent_id": None,
        "status": "queued",
        "duplicate": False,
    }
    run = Run.objects.get(pk=body["run_id"])
    assert (run.prompt_text, run.client_id, run.session) == ("Run the tests", "c1", session)
    assert run.attachments == [{"id": log.pk, "name": "log.txt", "mime_type": "text/plain", "size": 12}]


def test_a_new_turn_costs_the_api_five_queries(
    user: Any, session: Any, django_assert_num_queries: Any
) -> None:
    # Each is ~1 ms of the way from "send" to the first token (bench/README.md, ttft): this
    # catches one more slipping in. Token, the session locked (visibility checked in the
    # same read), the client id's earlier run or intent and the active run in one read, the
    # run, the session's updated_at; and the transaction's two ends. On PostgreSQL the
    # runners' NOTIFY too: this is the full path (a test's transaction rules out the one
    # statement of test_submit_commits), which rings them in a statement of its own.
    client = token_client(user)
    client.get("/api/projects")  # the token's first use also records it
    with django_assert_num_queries(7 + int(connection.vendor == "postgresql")):
        response = send(client, session)
    assert response.status_code == 202


def test_the_same_client_id_again_is_the_same_answer_marked_duplicate(api: Client, session: Any) -> None:
    first = send(api, session, client_id="same").json()
    again = send(api, session, client_id="same", text="something else").json()

    assert again == {**first, "duplicate": True}
    assert Run.objects.count() == 1


def test_a_message_while_a_run_is_active_is_queued_by_default(api: Client, session: Any) -> None:
    active = RunFactory(session=session, status=RunStatus.RUNNING)

    body = send(api, session, client_id="q1", text="And then lint").json()

    assert body["kind"] == "queue"
    assert body["run_id"] is None
    intent = PendingIntent.objects.get(pk=body["intent_id"])
    assert (intent.kind, intent.state, intent.text) == (
        IntentKind.QUEUE,
        IntentState.WAITING,
        "And then lint",
    )
    assert list(Run.objects.all()) == [active]


def test_a_steer_message_while_running_is_delivered_to_the_active_run(api: Client, session: Any) -> None:
    active = RunFactory(session=session, status=RunStatus.RUNNING)

    body = send(api, session, client_id="s1", text="Also run ruff", mode="steer").json()

    assert body["kind"] == "steer"
    intent = PendingIntent.objects.get(pk=body["intent_id"])
    assert intent.target_run == active
    assert Control.objects.filter(run=active, kind=ControlKind.STEER, target_id=str(intent.pk)).exists()


def test_a_message_to_an_archived_session_is_a_409(api: Client, project: Any) -> None:
    archived = SessionFactory(project=project, status="archived")

    response = send(api, archived)

    assert response.status_code == 409
    assert response.json()["code"] == "session_archived"
    assert not Run.objects.exists()


def test_a_blank_message_is_a_422(api: Client, session: Any) -> None:
    response = send(api, session, text="   ")
    assert response.status_code == 422
    assert response.json()["code"] == "empty_message"


@pytest.mark.parametrize(
    "body",
    [
        {"text": "hi"},
        {"client_id": "", "text": "hi"},
        {"client_id": "c" * 101, "text": "hi"},
        {"client_id": "c", "text": ""},
        {"client_id": "c", "text": "hi", "mode": "later"},
        {"client_id": "c", "text": "hi", "attachments": "file.txt"},
        {"client_id": 7, "text": ["hi"]},
    ],
)
def test_a_malformed_message_is_a_422_naming_the_fields(
    api: Client, session: Any, body: dict[str, Any]
) -> None:
    response = api.post(f"/api/sessions/{session.pk}/messages", body, content_type=JSON)

    assert response.status_code == 422
    assert response.json()["code"] == "validation_error"
    assert not Run.objects.exists()


# ---------------------------------------------------------------- transcript


def test_the_transcript_materializes_each_turn_and_lists_open_intents(api: Client, session: Any) -> None:
    events = json.loads((FIXTURES / "journal_tool_turn.json").read_text())["events"]
    done = run_with_events(
        [(e["type"], e["payload"]) for e in events],
        session=session,
        client_id="t1",
        prompt_text="Run the tests",
    )
    active = run_with_events(
        [("run.started", {"status": "running"}), ("token.delta", {"message_id": "m", "delta": "Work"})],
        session=session,
        client_id="t2",
        prompt_text="Now lint",
        status=RunStatus.RUNNING,
    )
    waiting = PendingIntentFactory(session=session, text="Then commit")
    PendingIntentFactory(session=session, state=IntentState.DELETED)

    body = api.get(f"/api/sessions/{session.pk}/transcript").json()

    assert body["session_id"] == session.pk
    assert body["active_run_id"] == active.pk
    assert [t["run_id"] for t in body["turns"]] == [done.pk, active.pk]
    first, second = body["turns"]
    assert (first["prompt_text"], first["status"], first["source"]) == (
        "Run the tests",
        "completed",
        "composer",
    )
    assert first["finished_at"] is not None
    texts = [[i["text"] for i in turn["state"]["items"] if i["kind"] == "text"] for turn in (first, second)]
    assert "".join(texts[0]) == "I'll run the tests.All 3 tests pass."
    assert first["state"]["terminal_state"] == "completed"
    assert first["state"]["tools"]["t1"]["arguments"]["env"]["API_KEY"] == "[REDACTED]"
    assert texts[1] == ["Work"]
    assert second["state"]["terminal"] is False
    assert [i["id"] for i in body["intents"]] == [waiting.pk]


def test_the_transcript_survives_events_without_the_ids_they_should_carry(api: Client, session: Any) -> None:
    run_with_events(
        [("approval.requested", {"title": "?"}), ("tool.started", {}), ("clarify.requested", {})],
        session=session,
    )

    response = api.get(f"/api/sessions/{session.pk}/transcript")

    assert response.status_code == 200
    assert response.json()["turns"][0]["state"]["approvals"] == {
        "null": {"kind": "approval", "title": "?", "resolved": False, "choice": None}
    }


def test_the_transcript_of_an_empty_session_is_empty(api: Client, session: Any) -> None:
    body = api.get(f"/api/sessions/{session.pk}/transcript").json()
    assert (body["turns"], body["intents"], body["active_run_id"]) == ([], [], None)


def test_the_transcript_agrees_with_the_runs_event_pages(api: Client, session: Any) -> None:
    run = run_with_events(
        [("token.delta", {"message_id": "m", "delta": str(i)}) for i in range(7)], session=session
    )
    pages: list[dict[str, Any]] = []
    cursor = 0
    while True:
        page = api.get(f"/api/runs/{run.pk}/events?after_seq={cursor}&limit=3").json()
        pages.extend(page["events"])
        if not page["has_more"]:
            break
        cursor = page["events"][-1]["seq"]

    transcript = api.get(f"/api/sessions/{session.pk}/transcript").json()
    assert transcript["turns"][0]["state"] == json.loads(json.dumps(page_state(materialize(pages))))


# ---------------------------------------------------------------- goal


def test_goal_is_answered_honestly_as_unsupported(api: Client, session: Any) -> None:
    response = api.post(
        f"/api/sessions/{session.pk}/goal", {"action": "set", "text": "Ship"}, content_type=JSON
    )

    assert response.status_code == 200
    body = response.json()
    assert body["accepted"] is False
    assert body["status"] == "unsupported"
    assert body["message"]


@pytest.mark.parametrize(
    ("body", "code"), [({"action": "explode"}, "invalid_action"), ({"action": "set"}, "missing_text")]
)
def test_an_invalid_goal_control_is_a_422(api: Client, session: Any, body: dict[str, Any], code: str) -> None:
    response = api.post(f"/api/sessions/{session.pk}/goal", body, content_type=JSON)
    assert response.status_code == 422
    assert response.json()["code"] == code
