"""Every open tab of a session sees the same events and the same intent changes."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from intents import services as intent_services
from runs import services
from runs.models import Run, RunStatus
from tests import factories
from tests.support.live import LiveSocket, LiveStack, assert_contiguous, layer, live, session_cookie  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

SOCKETS = 50


def test_fifty_sockets_on_one_run_all_receive_the_full_sequence(live: LiveStack) -> None:
    live.start_daphne()
    live.start_runner()
    session = factories.SessionFactory()
    cookie = session_cookie(session.project.owner)
    sockets = [live.socket(session.pk, cookie) for _ in range(SOCKETS)]
    for socket in sockets:
        socket.subscribe()
    for socket in sockets:
        socket.session()
    result = services.do_submit_message(session, client_id="fan-1", text="plan the work")
    assert result.run is not None
    run_id = result.run.pk

    def collect(socket: LiveSocket) -> list[dict[str, Any]]:
        return socket.events_to_terminal(run_id, timeout=120)

    with ThreadPoolExecutor(SOCKETS) as pool:
        received = list(pool.map(collect, sockets))
    run = Run.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED and run.last_seq > 10
    for events in received:
        assert_contiguous(events, 1, run.last_seq)
    assert len({tuple(e["event_id"] for e in events) for events in received}) == 1


def test_two_tabs_see_the_same_intent_changes(live: LiveStack) -> None:
    live.start_daphne()
    session = factories.SessionFactory()
    factories.RunFactory(session=session, status=RunStatus.RUNNING)
    cookie = session_cookie(session.project.owner)
    tabs = [live.socket(session.pk, cookie) for _ in range(2)]
    for tab in tabs:
        tab.subscribe()
        assert tab.session()["intents"] == []

    queued = services.do_submit_message(session, client_id="q-1", text="then run the tests", mode="queue")
    assert queued.intent is not None
    for tab in tabs:
        snapshot = tab.until(lambda f: f["type"] == "session" and f["session"]["intents"])[-1]["session"]
        assert [(i["id"], i["text"], i["state"]) for i in snapshot["intents"]] == [
            (queued.intent.pk, "then run the tests", "waiting")
        ]

    intent_services.do_edit_intent(queued.intent, version=queued.intent.version, text="then lint")
    for tab in tabs:
        tab.until(
            lambda f: f["type"] == "session" and [i["text"] for i in f["session"]["intents"]] == ["then lint"]
        )

    queued.intent.refresh_from_db()
    intent_services.do_delete_intent(queued.intent, version=queued.intent.version)
    for tab in tabs:
        tab.until(lambda f: f["type"] == "session" and f["session"]["intents"] == [])
