"""The channel layer is a doorbell: lost or event-less notifications are repaired from the database."""

from __future__ import annotations

from typing import Any

import pytest

from intents.models import PendingIntent
from runs import journal, notify
from runs.journal import NewEvent
from runs.models import RunStatus
from tests import factories
from tests.support.live import LiveStack, assert_contiguous, layer, live, session_cookie  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def deltas(first: int, count: int) -> list[NewEvent]:
    return [
        NewEvent("token.delta", {"message_id": "m1", "delta": f"{i} "}) for i in range(first, first + count)
    ]


def watch(live: LiveStack) -> tuple[Any, Any, Any]:
    session = factories.SessionFactory()
    run = factories.RunFactory(session=session, status=RunStatus.RUNNING)
    socket = live.socket(session.pk, session_cookie(session.project.owner))
    socket.subscribe()
    assert socket.session()["active_run_id"] == run.pk
    return session, run, socket


def test_a_lost_notification_is_repaired_when_the_next_one_shows_the_gap(live: LiveStack) -> None:
    # No safety poll to speak of: with Redis only the gap in the next notification can repair it.
    live.start_daphne(HERMESWEB_LIVE_SAFETY_POLL_SECONDS="3600")
    _, run, socket = watch(live)
    journal.append_batch(run.pk, deltas(1, 3))
    assert_contiguous(socket.events_until(run.pk, lambda e: e["seq"] == 3), 1, 3)
    journal.append_batch(run.pk, deltas(4, 5), publish=False)  # the notification that got lost
    journal.append_batch(run.pk, deltas(9, 1))
    assert_contiguous(socket.events_until(run.pk, lambda e: e["seq"] == 9), 4, 9)
    journal.append_batch(run.pk, [journal.done_event("completed")])
    assert_contiguous(socket.events_to_terminal(run.pk), 10, 10)


def test_a_notification_without_its_events_is_read_from_the_database(live: LiveStack) -> None:
    live.start_daphne(HERMESWEB_LIVE_SAFETY_POLL_SECONDS="3600")
    _, run, socket = watch(live)
    count = notify.INLINE_EVENTS_MAX + 50
    journal.append_batch(run.pk, deltas(1, count))
    assert_contiguous(socket.events_until(run.pk, lambda e: e["seq"] == count), 1, count)


def test_events_arrive_when_no_notification_ever_comes(live: LiveStack) -> None:
    live.start_daphne(HERMESWEB_LIVE_SAFETY_POLL_SECONDS="0.5")
    _, run, socket = watch(live)
    journal.append_batch(run.pk, deltas(1, 4), publish=False)
    journal.append_batch(run.pk, [journal.done_event("completed")], publish=False)
    assert_contiguous(socket.events_to_terminal(run.pk), 1, 5)
    assert socket.until(lambda f: f["type"] == "session" and f["session"]["active_run_id"] is None)


def test_session_changes_arrive_when_no_notification_ever_comes(live: LiveStack) -> None:
    live.start_daphne(HERMESWEB_LIVE_SAFETY_POLL_SECONDS="0.5")
    session, _, socket = watch(live)
    intent = factories.PendingIntentFactory(session=session, text="then run the tests")
    snapshot = socket.until(lambda f: f["type"] == "session" and f["session"]["intents"])[-1]["session"]
    assert [i["id"] for i in snapshot["intents"]] == [intent.pk]
    PendingIntent.objects.filter(pk=intent.pk).update(text="then lint")  # no updated_at bump, no doorbell
    from projects.models import Session

    Session.objects.filter(pk=session.pk).update(title="Renamed quietly")
    snapshot = socket.until(lambda f: f["type"] == "session" and f["session"]["title"] == "Renamed quietly")
    assert snapshot[-1]["session"]["intents"][0]["text"] == "then lint"


def test_a_runners_group_commit_reaches_every_session_it_names(live: LiveStack) -> None:
    # Runners publish one journal-group message per group commit; with no safety poll to speak
    # of, only that message can bring these events to the two sockets.
    import asyncio

    from runs.runner.writer import JournalWriter

    live.start_daphne(HERMESWEB_LIVE_SAFETY_POLL_SECONDS="3600")
    watched = [watch(live) for _ in range(2)]

    async def write() -> None:
        writers = [JournalWriter(run.pk, window_ms=10_000) for _, run, _ in watched]
        for writer in writers:
            writer.add(deltas(1, 3))
        await asyncio.gather(*(writer.flush() for writer in writers))

    asyncio.run(write())
    for _, run, socket in watched:
        events = socket.events_until(run.pk, lambda e: e["seq"] == 1)
        assert [e["payload"]["delta"] for e in events] == ["1 2 3 "]  # one coalesced row
