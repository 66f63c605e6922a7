"""Pending intents over the API: list, edit with versions, withdraw, steer, stop-and-send."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from intents.api import INTENTS_PAGE, INTENTS_PAGE_MAX
from intents.models import IntentKind, IntentState, PendingIntent
from intents.previews import INTENT_PREVIEW_CHARS
from runs.live.reads import session_snapshot
from runs.models import Control, ControlKind, Run, RunStatus
from tests.factories import PendingIntentFactory, ProjectFactory, RunFactory, SessionFactory

pytestmark = pytest.mark.django_db

JSON = "application/json"


@pytest.fixture
def busy(session: Any) -> Run:
    """The session's active, executing run."""
    return RunFactory(session=session, status=RunStatus.RUNNING)


def test_it_lists_the_sessions_open_intents_in_queue_order(api: Client, session: Any) -> None:
    second = PendingIntentFactory(session=session, position=1, text="second")
    first = PendingIntentFactory(session=session, position=0, text="first")
    gone = PendingIntentFactory(session=session, position=2, state=IntentState.DELETED)

    open_ids = [i["id"] for i in api.get(f"/api/sessions/{session.pk}/intents").json()["intents"]]
    everything = api.get(f"/api/sessions/{session.pk}/intents?include_closed=true").json()

    assert open_ids == [first.pk, second.pk]
    # The history comes in creation order: a cursor on positions would skip items that move.
    assert [i["id"] for i in everything["intents"]] == [second.pk, first.pk, gone.pk]
    assert (everything["has_more"], everything["after"]) == (False, None)


FIELDS = {
    "id", "session_id", "client_id", "kind", "state", "text", "attachments", "position", "version",
    "source", "source_meta", "target_run_id", "run_id", "reason", "created_at", "updated_at",
}  # fmt: skip


def test_an_intent_is_serialised_with_every_field(api: Client, session: Any) -> None:
    intent = PendingIntentFactory(session=session)
    body = api.get(f"/api/intents/{intent.pk}").json()

    assert set(body) == FIELDS
    assert (body["id"], body["version"], body["state"]) == (intent.pk, 1, "waiting")


def test_a_listed_intent_has_every_field_and_says_how_long_its_text_is(api: Client, session: Any) -> None:
    intent = PendingIntentFactory(session=session, text="Then run the tests.")
    body = api.get(f"/api/sessions/{session.pk}/intents").json()["intents"][0]

    assert set(body) == FIELDS | {"text_length", "truncated"}
    assert (body["id"], body["text"], body["text_length"], body["truncated"]) == (
        intent.pk,
        "Then run the tests.",
        len("Then run the tests."),
        False,
    )


def test_the_list_sends_a_preview_of_a_long_text_and_the_intent_has_it_whole(
    api: Client, session: Any
) -> None:
    text = "é" * 5_000 + "the end"
    intent = PendingIntentFactory(session=session, text=text)

    listed = api.get(f"/api/sessions/{session.pk}/intents").json()["intents"][0]
    whole = api.get(f"/api/intents/{intent.pk}").json()

    # The same preview as the socket's snapshot: one rule for both.
    previewed = session_snapshot(session.pk)["intents"][0]
    cut = ("text", "text_length", "truncated")
    assert [listed[key] for key in cut] == [previewed[key] for key in cut]
    assert listed["text"] == text[:INTENT_PREVIEW_CHARS]
    assert (listed["truncated"], listed["text_length"]) == (True, len(text))
    assert whole["text"] == text


def test_the_transcript_sends_the_same_previews_as_the_intents_list(api: Client, session: Any) -> None:
    long = PendingIntentFactory(session=session, text="ü" * 50_000 + "the end")
    short = PendingIntentFactory(session=session, text="short")

    transcript = api.get(f"/api/sessions/{session.pk}/transcript").json()["intents"]
    listed = api.get(f"/api/sessions/{session.pk}/intents").json()["intents"]

    assert transcript == listed
    assert [i["id"] for i in transcript] == [long.pk, short.pk]
    assert transcript[0]["text"] == long.text[:INTENT_PREVIEW_CHARS]
    assert (transcript[0]["truncated"], transcript[0]["text_length"]) == (True, len(long.text))
    assert (transcript[1]["text"], transcript[1]["truncated"]) == ("short", False)


def settled_intents(session: Any, count: int) -> list[int]:
    PendingIntent.objects.bulk_create(
        PendingIntent(session=session, client_id=f"old-{n}", text=f"old {n}", state=IntentState.DISPATCHED)
        for n in range(count)
    )
    return list(PendingIntent.objects.filter(session=session).order_by("pk").values_list("pk", flat=True))


def test_the_whole_history_comes_a_bounded_page_at_a_time(api: Client, session: Any) -> None:
    ids = settled_intents(session, INTENTS_PAGE + 3)
    url = f"/api/sessions/{session.pk}/intents"

    with CaptureQueriesContext(connection) as queries:
        first = api.get(url, {"include_closed": "true"}).json()
    # The database hands over a page, not the history.
    assert any(f"LIMIT {INTENTS_PAGE + 1}" in q["sql"] for q in queries.captured_queries)
    rest = api.get(url, {"include_closed": "true", "after": first["after"]}).json()
    small = api.get(url, {"include_closed": "true", "limit": 2, "after": ids[0]}).json()

    assert [i["id"] for i in first["intents"]] == ids[:INTENTS_PAGE]
    assert (first["has_more"], first["after"]) == (True, ids[INTENTS_PAGE - 1])
    assert [i["id"] for i in rest["intents"]] == ids[INTENTS_PAGE:]
    assert (rest["has_more"], rest["after"]) == (False, None)
    assert [i["id"] for i in small["intents"]] == ids[1:3] and small["after"] == ids[2]


def test_the_open_queue_comes_whole_however_long_it_is(api: Client, session: Any) -> None:
    settled_intents(session, 3)
    waiting = [PendingIntentFactory(session=session).pk for _ in range(INTENTS_PAGE + 5)]

    body = api.get(f"/api/sessions/{session.pk}/intents").json()

    assert [i["id"] for i in body["intents"]] == waiting
    assert (body["has_more"], body["after"]) == (False, None)


@pytest.mark.parametrize(
    ("query", "code", "field"),
    [
        ({"include_closed": "true", "limit": 0}, "validation_error", "limit"),
        ({"include_closed": "true", "limit": INTENTS_PAGE_MAX + 1}, "validation_error", "limit"),
        ({"include_closed": "true", "limit": "ten"}, "validation_error", "limit"),
        ({"include_closed": "true", "after": -1}, "validation_error", "after"),
        ({"include_closed": "true", "after": 2**63}, "validation_error", "after"),
        ({"limit": 10}, "include_closed_required", None),
        ({"after": 1}, "include_closed_required", None),
    ],
)
def test_a_bad_page_of_intents_is_a_422_saying_why(
    api: Client, session: Any, query: dict[str, Any], code: str, field: str | None
) -> None:
    response = api.get(f"/api/sessions/{session.pk}/intents", query)

    assert response.status_code == 422, response.content
    body = response.json()
    assert body["code"] == code
    if field:
        assert [d["field"] for d in body["details"]] == [field]


def test_another_users_intent_is_not_found(session: Any, other_user: Any) -> None:
    intent = PendingIntentFactory(session=session)
    stranger = Client()
    stranger.force_login(other_user)

    response = stranger.get(f"/api/intents/{intent.pk}")

    assert response.status_code == 404 and response.json()["code"] == "not_found"


def test_it_edits_text_when_the_version_matches(api: Client, session: Any, busy: Run) -> None:
    intent = PendingIntentFactory(session=session)

    response = api.patch(f"/api/intents/{intent.pk}", {"version": 1, "text": "Edited"}, content_type=JSON)

    assert response.status_code == 200
    assert response.json()["status"] == "accepted"
    assert response.json()["intent"]["text"] == "Edited"
    assert response.json()["intent"]["version"] == 2


def test_a_stale_version_is_a_409_carrying_the_current_intent(api: Client, session: Any, busy: Run) -> None:
    intent = PendingIntentFactory(session=session, version=3, text="Current")

    response = api.patch(
        f"/api/intents/{intent.pk}", {"version": 2, "text": "Lost update"}, content_type=JSON
    )

    assert response.status_code == 409
    body = response.json()
    assert body["code"] == "conflict"
    assert body["details"]["intent"]["text"] == "Current"
    assert body["details"]["intent"]["version"] == 3
    intent.refresh_from_db()
    assert intent.text == "Current"


def test_it_moves_an_intent(api: Client, session: Any, busy: Run) -> None:
    a = PendingIntentFactory(session=session, position=0)
    b = PendingIntentFactory(session=session, position=1)

    response = api.patch(f"/api/intents/{b.pk}", {"version": 1, "position": 0}, content_type=JSON)

    assert response.json()["intent"]["position"] == 0
    assert [i["id"] for i in api.get(f"/api/sessions/{session.pk}/intents").json()["intents"]] == [b.pk, a.pk]


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"text": "x"},
        {"version": 0},
        {"version": "one"},
        {"version": 2**40},
        {"version": 1, "position": -1},
    ],
)
def test_a_malformed_edit_is_a_422(api: Client, session: Any, body: dict[str, Any]) -> None:
    intent = PendingIntentFactory(session=session)
    response = api.patch(f"/api/intents/{intent.pk}", body, content_type=JSON)
    assert response.status_code == 422
    assert response.json()["code"] == "validation_error"


def test_editing_a_dispatched_intent_is_answered_not_active(api: Client, session: Any) -> None:
    intent = PendingIntentFactory(session=session, state=IntentState.DISPATCHED)

    response = api.patch(f"/api/intents/{intent.pk}", {"version": 1, "text": "late"}, content_type=JSON)

    assert response.status_code == 200
    assert response.json()["status"] == "not_active"


@pytest.mark.parametrize("how", ["query", "body", "none"])
def test_it_withdraws_an_intent_with_the_version_in_query_or_body(
    api: Client, session: Any, busy: Run, how: str
) -> None:
    intent = PendingIntentFactory(session=session)
    url = f"/api/intents/{intent.pk}"

    if how == "query":
        response = api.delete(f"{url}?version=1")
    elif how == "body":
        response = api.delete(url, {"version": 1}, content_type=JSON)
    else:
        response = api.delete(url)

    assert response.status_code == 200
    assert response.json()["status"] == "accepted"
    intent.refresh_from_db()
    assert intent.state == IntentState.DELETED


def test_withdrawing_with_a_stale_version_is_a_409(api: Client, session: Any) -> None:
    intent = PendingIntentFactory(session=session, version=2)
    response = api.delete(f"/api/intents/{intent.pk}?version=1")
    assert response.status_code == 409
    assert response.json()["details"]["intent"]["version"] == 2


def test_withdrawing_twice_is_a_duplicate(api: Client, session: Any) -> None:
    intent = PendingIntentFactory(session=session)
    api.delete(f"/api/intents/{intent.pk}")
    assert api.delete(f"/api/intents/{intent.pk}").json()["status"] == "duplicate"


def test_a_queued_intent_can_be_upgraded_to_steer(api: Client, session: Any, busy: Run) -> None:
    intent = PendingIntentFactory(session=session)

    response = api.post(f"/api/intents/{intent.pk}/steer")

    assert response.status_code == 200
    assert response.json()["status"] == "accepted"
    assert response.json()["intent"]["kind"] == IntentKind.STEER
    assert Control.objects.filter(run=busy, kind=ControlKind.STEER).exists()


def test_steering_with_no_run_to_take_it_is_a_409_with_the_reason(api: Client, session: Any) -> None:
    intent = PendingIntentFactory(session=session)

    response = api.post(f"/api/intents/{intent.pk}/steer")

    assert response.status_code == 409
    assert response.json()["code"] == "conflict"
    assert response.json()["details"]["intent"]["reason"]


def test_stop_and_send_cancels_the_run_and_sends_the_intent_next(
    api: Client, session: Any, busy: Run
) -> None:
    intent = PendingIntentFactory(session=session)

    response = api.post(f"/api/intents/{intent.pk}/stop-and-send")

    assert response.status_code == 200
    assert response.json()["status"] == "accepted"
    assert response.json()["intent"]["state"] == IntentState.STOPPING
    busy.refresh_from_db()
    assert busy.status == RunStatus.CANCELLING
    assert api.post(f"/api/intents/{intent.pk}/stop-and-send").json()["status"] == "duplicate"


def test_stop_and_send_with_nothing_running_sends_at_once(api: Client, session: Any) -> None:
    intent = PendingIntentFactory(session=session)

    body = api.post(f"/api/intents/{intent.pk}/stop-and-send").json()

    intent.refresh_from_db()
    assert body["status"] == "accepted"
    assert intent.run is not None
    assert intent.run.prompt_text == intent.text


@pytest.mark.parametrize(
    ("method", "suffix"), [("patch", ""), ("delete", ""), ("post", "/steer"), ("post", "/stop-and-send")]
)
def test_someone_elses_intent_is_a_404(api: Client, other_user: Any, method: str, suffix: str) -> None:
    theirs = PendingIntentFactory(session=SessionFactory(project=ProjectFactory(owner=other_user)))

    response = getattr(api, method)(f"/api/intents/{theirs.pk}{suffix}", {"version": 1}, content_type=JSON)

    assert response.status_code == 404
    theirs.refresh_from_db()
    assert (theirs.state, theirs.version) == (IntentState.WAITING, 1)


def test_someone_elses_session_intents_are_a_404(api: Client, other_user: Any) -> None:
    theirs = SessionFactory(project=ProjectFactory(owner=other_user))
    assert api.get(f"/api/sessions/{theirs.pk}/intents").status_code == 404


def test_an_unknown_intent_is_a_404(api: Client) -> None:
    assert api.post(f"/api/intents/{2**70}/steer").status_code == 404
    assert not PendingIntent.objects.exists()


def test_stop_and_send_for_a_run_that_already_ended_is_a_conflict_and_cancels_nothing(
    api: Any, session: Any
) -> None:
    from intents.services import enqueue
    from runs.models import Run

    old = RunFactory(session=session, status="completed")
    current = RunFactory(session=session, status="running")
    intent = enqueue(session, client_id="late", text="next")
    response = api.post(
        f"/api/intents/{intent.pk}/stop-and-send", {"run_id": old.pk}, content_type="application/json"
    )
    assert response.status_code == 409 and response.json()["code"] == "conflict"
    assert Run.objects.get(pk=current.pk).status == "running"
    intent.refresh_from_db()
    assert intent.state == "waiting" and intent.kind == "queue"


def test_a_blank_edit_is_a_validation_error(api: Any, session: Any) -> None:
    from intents.services import enqueue

    RunFactory(session=session, status="running")
    intent = enqueue(session, client_id="blank", text="keep me")
    response = api.patch(
        f"/api/intents/{intent.pk}",
        {"version": intent.version, "text": "   "},
        content_type="application/json",
    )
    assert response.status_code == 422
