"""Subscribe cursors: terminal replay, paging, and the edge cases (ahead, expired, another run's seq)."""

from __future__ import annotations

from typing import Any

import pytest

from projects.models import Session
from runs import journal
from runs.journal import NewEvent
from runs.models import Run, RunStatus
from tests import factories
from tests.support.live import LiveSocket, LiveStack, assert_contiguous, layer, live, session_cookie  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def delta(text: str) -> NewEvent:
    return NewEvent("token.delta", {"message_id": "m1", "delta": text})


def finished_run(session: Session, deltas: int = 5) -> Run:
    """A run whose journal is run.started, `deltas` token deltas, done: last seq deltas + 2."""
    events = [("run.started", {"status": "running"})]
    events += [("token.delta", {"message_id": "m1", "delta": f"{i} "}) for i in range(deltas)]
    events += [("done", {"state": "completed", "stop_reason": "end_turn"})]
    return factories.run_with_events(events, session=session)


def active_run(session: Session, deltas: int = 0, publish: bool = False) -> Run:
    run = factories.RunFactory(session=session, status=RunStatus.RUNNING)
    if deltas:
        journal.append_batch(run.pk, [delta(f"{i} ") for i in range(deltas)], publish=publish)
    return run


@pytest.fixture
def session(live: LiveStack) -> Any:
    live.start_daphne(HERMESWEB_EVENTS_PAGE_MAX="7")
    return factories.SessionFactory()


def open_socket(live: LiveStack, session: Any) -> LiveSocket:
    return live.socket(session.pk, session_cookie(session.project.owner))


def test_a_finished_run_replays_from_the_cursor_through_its_terminal_event(
    live: LiveStack, session: Any
) -> None:
    run = finished_run(session, deltas=30)
    socket = open_socket(live, session)
    socket.subscribe({run.pk: 2})
    events = socket.events_to_terminal(run.pk)
    # 30 events in pages of 7: paging loses and repeats nothing.
    assert_contiguous(events, 3, 32)
    assert events[-1]["type"] == "done" and events[-1]["terminal"]
    assert events[0]["event_id"] == f"{run.pk}:3" and events[0]["session_id"] == session.pk
    assert not [f for f in socket.quiet(0.5) if f["type"] == "event"]


def test_an_empty_subscribe_gets_a_snapshot_and_the_active_run_from_its_start(
    live: LiveStack, session: Any
) -> None:
    old = finished_run(session)
    run = active_run(session, deltas=3)
    socket = open_socket(live, session)
    socket.subscribe()
    first = socket.recv()
    assert first["type"] == "session"
    snapshot = first["session"]
    assert snapshot["active_run_id"] == run.pk and snapshot["active_run_status"] == "running"
    assert snapshot["title"] == session.title and snapshot["intents"] == []
    assert snapshot["agent"] == "demo" and snapshot["running_default"] == "queue"
    events = socket.events_until(run.pk, lambda e: e["seq"] == 3)
    assert_contiguous(events, 1, 3)
    assert not [f for f in socket.frames if f["type"] == "event" and f["event"]["run_id"] == old.pk]


def test_a_cursor_ahead_of_the_run_is_refused_with_cursor_ahead(live: LiveStack, session: Any) -> None:
    run = finished_run(session)
    socket = open_socket(live, session)
    socket.subscribe({run.pk: run.last_seq + 5})
    error = socket.until(lambda f: f["type"] == "error")[-1]
    assert error["code"] == "cursor_ahead" and error["run_id"] == run.pk
    assert not [f for f in socket.quiet(0.5) if f["type"] == "event"]


def test_an_expired_cursor_gets_cursor_expired(live: LiveStack, session: Any) -> None:
    run = finished_run(session)
    Run.objects.filter(pk=run.pk).update(compacted_through=4)
    socket = open_socket(live, session)
    socket.subscribe({run.pk: 2})
    error = socket.until(lambda f: f["type"] == "error")[-1]
    assert error["code"] == "cursor_expired" and error["run_id"] == run.pk
    # Reloading from the start is always possible.
    socket.subscribe({run.pk: 0})
    assert_contiguous(socket.events_to_terminal(run.pk), 1, run.last_seq)


def test_a_cursor_of_another_run_does_not_drop_this_runs_events(live: LiveStack, session: Any) -> None:
    """hermes-webui #3125: seqs compared across runs dropped the new run's first events."""
    old = finished_run(session, deltas=20)
    run = active_run(session, deltas=3)
    socket = open_socket(live, session)
    socket.subscribe({old.pk: old.last_seq})
    assert_contiguous(socket.events_until(run.pk, lambda e: e["seq"] == 3), 1, 3)
    journal.append_batch(run.pk, [delta("four "), delta("five ")])
    assert_contiguous(socket.events_until(run.pk, lambda e: e["seq"] == 5), 4, 5)
    assert not [f for f in socket.frames if f["type"] == "event" and f["event"]["run_id"] == old.pk]


def test_a_cursor_for_the_active_run_resumes_after_it(live: LiveStack, session: Any) -> None:
    run = active_run(session, deltas=4)
    socket = open_socket(live, session)
    socket.subscribe({run.pk: 2})
    journal.append_batch(run.pk, [delta("five ")])
    assert_contiguous(socket.events_until(run.pk, lambda e: e["seq"] == 5), 3, 5)


def test_a_run_of_another_session_is_a_bad_request_and_the_other_cursors_stand(
    live: LiveStack,
    session: Any,
) -> None:
    mine = finished_run(session)
    elsewhere = finished_run(factories.SessionFactory(project=session.project))
    socket = open_socket(live, session)
    socket.subscribe({elsewhere.pk: 0, mine.pk: 3})
    error = socket.until(lambda f: f["type"] == "error")[-1]
    assert error["code"] == "bad_request" and error["run_id"] == elsewhere.pk
    assert_contiguous(socket.events_to_terminal(mine.pk), 4, mine.last_seq)
    assert not [f for f in socket.frames if f["type"] == "event" and f["event"]["run_id"] == elsewhere.pk]


def test_a_new_run_is_followed_from_seq_1(live: LiveStack, session: Any) -> None:
    old = finished_run(session)
    socket = open_socket(live, session)
    socket.subscribe({old.pk: old.last_seq})
    socket.session()
    run = active_run(session, deltas=2, publish=True)
    journal.append_batch(run.pk, [delta("three "), journal.done_event("completed")])
    assert_contiguous(socket.events_to_terminal(run.pk), 1, 4)
