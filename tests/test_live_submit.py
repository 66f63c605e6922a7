"""Sending a message over the session socket: the POST's rules and answers, without the HTTP request."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from django.contrib.sessions.models import Session as DjangoSession

from intents.models import PendingIntent
from projects.models import SessionStatus
from runs.models import Run, RunStatus
from tests import factories
from tests.support.live import LiveSocket, LiveStack, assert_contiguous, layer, live, session_cookie  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def answer(socket: LiveSocket, client_id: str) -> dict[str, Any]:
    frames = socket.until(lambda f: f["type"] == "submitted" and f["client_id"] == client_id)
    return frames[-1]


def connected(live: LiveStack, **session_fields: Any) -> tuple[Any, LiveSocket, str]:
    session = factories.SessionFactory(**session_fields)
    cookie = session_cookie(session.project.owner)
    return session, live.socket(session.pk, cookie), cookie


def test_a_message_sent_over_the_socket_is_a_turn_that_streams_back_on_it(live: LiveStack) -> None:
    live.start_daphne()
    live.start_runner()
    session, socket, _ = connected(live)
    socket.subscribe()
    socket.session()

    socket.send(type="submit", client_id="c1", text="hello there")

    result = answer(socket, "c1")["result"]
    assert result == {
        "kind": "run",
        "run_id": result["run_id"],
        "intent_id": None,
        "status": "queued",
        "duplicate": False,
    }
    run = Run.objects.get(pk=result["run_id"])
    assert (run.session_id, run.client_id, run.prompt_text) == (session.pk, "c1", "hello there")
    events = socket.events_to_terminal(run.pk)
    assert_contiguous(events, 1)
    assert events[-1]["payload"]["state"] == "completed"


def test_the_same_client_id_again_is_the_first_answer_marked_duplicate(live: LiveStack) -> None:
    live.start_daphne()
    _, socket, _ = connected(live)

    socket.send(type="submit", client_id="same", text="once")
    first = answer(socket, "same")["result"]
    socket.send(type="submit", client_id="same", text="twice?")
    again = answer(socket, "same")["result"]

    assert again == {**first, "duplicate": True}
    assert Run.objects.count() == 1


def test_a_message_while_a_run_is_active_is_queued(live: LiveStack) -> None:
    live.start_daphne()
    session, socket, _ = connected(live)
    factories.RunFactory(session=session, status=RunStatus.RUNNING)

    socket.send(type="submit", client_id="q1", text="and then lint", mode="queue")

    result = answer(socket, "q1")["result"]
    assert (result["kind"], result["run_id"]) == ("queue", None)
    assert PendingIntent.objects.get(pk=result["intent_id"]).text == "and then lint"


def test_an_invalid_message_is_refused_field_by_field_and_the_socket_stays_open(live: LiveStack) -> None:
    live.start_daphne()
    _, socket, _ = connected(live)

    socket.send(type="submit", client_id="bad", text="", mode="shout")

    error = answer(socket, "bad")["error"]
    assert (error["status"], error["code"]) == (422, "validation_error")
    assert {detail["field"] for detail in error["details"]} == {"text", "mode"}
    assert not Run.objects.exists()
    socket.send(type="ping")
    assert socket.until(lambda f: f["type"] == "pong")


def test_a_submit_without_a_client_id_is_a_bad_request(live: LiveStack) -> None:
    live.start_daphne()
    _, socket, _ = connected(live)

    socket.send(type="submit", text="who am I answering?")

    error = socket.until(lambda f: f["type"] == "error")[-1]
    assert error["code"] == "bad_request" and "client_id" in error["message"]
    assert not Run.objects.exists()


def test_an_archived_session_refuses_with_409(live: LiveStack) -> None:
    live.start_daphne()
    _, socket, _ = connected(live, status=SessionStatus.ARCHIVED)

    socket.send(type="submit", client_id="c1", text="hello")

    error = answer(socket, "c1")["error"]
    assert (error["status"], error["code"]) == (409, "session_archived")
    assert not Run.objects.exists()


@pytest.mark.parametrize("how", ["signed_out_in_another_tab", "password_changed_elsewhere"])
def test_a_socket_whose_sign_in_ended_may_no_longer_send(live: LiveStack, how: str) -> None:
    live.start_daphne()
    session, socket, cookie = connected(live)
    socket.send(type="ping")
    socket.until(lambda f: f["type"] == "pong")

    if how == "signed_out_in_another_tab":
        DjangoSession.objects.filter(session_key=cookie).delete()
    else:
        owner = session.project.owner
        owner.set_password("a new one, elsewhere")
        owner.save()
    socket.send(type="submit", client_id="c1", text="hello")

    error = answer(socket, "c1")["error"]
    assert (error["status"], error["code"]) == (401, "not_authenticated")
    assert socket.close_code() == 4401
    assert not Run.objects.exists()


def test_a_submit_that_finds_the_database_unavailable_is_refused_as_503(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.contrib.sessions.backends.db import SessionStore
    from django.db import OperationalError
    from django.test import Client

    from runs import services
    from runs.live.consumer import answer_submit
    from runs.live.protocol import Submit
    from runs.schemas import MessageIn

    session = factories.SessionFactory()

    def unreachable(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("server closed the connection unexpectedly")

    user = session.project.owner
    client = Client()
    client.force_login(user)  # a signed-in socket's scope: its user and its session
    scope = {"user": user, "session": SessionStore(client.session.session_key)}
    monkeypatch.setattr(services, "do_submit_message_as", unreachable)

    answer = answer_submit(scope, session.pk, Submit(MessageIn(client_id="c-1", text="hello")))

    assert not answer.signed_out
    frame = orjson.loads(answer.frame)
    assert frame["client_id"] == "c-1"
    assert frame["error"]["status"] == 503 and frame["error"]["code"] == "database_unavailable"
