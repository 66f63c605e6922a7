"""One socket's subscription (runs.live.subscription): replay from cursors, per-run dedupe, overflow
resync, direct sends when idle; gaps are the feed's to repair, never read here."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from asgiref.sync import async_to_sync

from runs import journal
from runs.journal import NewEvent
from runs.live import subscription as subscription_module
from runs.live.feed import EventsItem, RunUnreadable, get_hub
from runs.live.protocol import EventFrame, error_frame, event_frame
from runs.live.reads import plan_subscription, run_floor
from runs.live.subscription import BrokenFeed, Subscription
from runs.models import RunStatus
from tests import factories


class Recorder:
    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.wire: list[str] = []  # each frame's type as sent
        self.on_send: Callable[[], Awaitable[None]] | None = None

    async def __call__(self, frame: str) -> None:
        decoded = orjson.loads(frame)
        self.wire.append(decoded["type"])
        if decoded["type"] == "events":  # catch-up: a page in one frame, read as its events
            self.frames.extend({"type": "event", "event": event} for event in decoded["events"])
        else:
            self.frames.append(decoded)
        if self.on_send is not None:
            await self.on_send()

    def seqs(self, run_id: int) -> list[int]:
        return [
            f["event"]["seq"] for f in self.frames if f["type"] == "event" and f["event"]["run_id"] == run_id
        ]


def batch(run_id: int, session_id: int, seqs: range, terminal_at: int | None = None) -> EventsItem:
    """What a feed hands its subscribers: consecutive event frames of one run."""
    frames = [
        EventFrame(
            seq,
            seq == terminal_at,
            event_frame(
                {"run_id": run_id, "session_id": session_id, "seq": seq, "terminal": seq == terminal_at}
            ),
        )
        for seq in seqs
    ]
    return EventsItem(run_id, frames)


def finished(session: Any, count: int) -> Any:
    events = [("token.delta", {"message_id": "m", "delta": "x"})] * (count - 1) + [
        ("done", {"state": "completed"})
    ]
    return factories.run_with_events(events, session=session)


def deltas(count: int) -> list[NewEvent]:
    return [NewEvent("token.delta", {"message_id": "m", "delta": f"{i}"}) for i in range(count)]


def following(send: Recorder, sent: dict[int, int], session_id: int = 1) -> Subscription:
    sub = Subscription(session_id, {}, send)
    sub.followed, sub.sent = set(sent), dict(sent)
    return sub


def test_dedupe_is_per_run_and_a_batch_overlapping_what_was_sent_sends_only_the_rest() -> None:
    send = Recorder()
    sub = following(send, {5: 0, 6: 50})

    async def scenario() -> None:
        await sub.deliver(batch(5, 1, range(1, 3)))
        await sub.deliver(batch(5, 1, range(1, 3)))  # a duplicate notification
        await sub.deliver(batch(5, 1, range(2, 5)))  # overlaps a replay
        await sub.deliver(batch(6, 1, range(40, 52)))  # another run's cursor is its own

    async_to_sync(scenario)()
    assert send.seqs(5) == [1, 2, 3, 4]
    assert send.seqs(6) == [51]


def test_a_batch_that_skips_seqs_is_a_broken_feed_not_read_from_the_database(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_reads(*args: Any) -> None:
        raise AssertionError("the subscription read the database")

    monkeypatch.setattr(subscription_module, "read_page", no_reads)
    send = Recorder()
    sub = following(send, {5: 2})

    with pytest.raises(BrokenFeed):
        async_to_sync(sub.deliver)(batch(5, 1, range(6, 9)))  # 3..5 never came from the feed
    assert send.frames == []


@pytest.mark.django_db(transaction=True)
def test_runs_neither_asked_for_nor_new_are_ignored_and_new_ones_start_at_one() -> None:
    session = factories.SessionFactory()
    older = finished(session, 3)
    newer = factories.RunFactory(session=session, status=RunStatus.RUNNING)
    send = Recorder()
    sub = Subscription(session.pk, {}, send)
    sub.floor = older.pk

    async def scenario() -> None:
        await sub.deliver(batch(older.pk, session.pk, range(2, 4)))
        await sub.deliver(batch(newer.pk, session.pk, range(1, 4)))

    async_to_sync(scenario)()
    assert send.seqs(older.pk) == []
    assert send.seqs(newer.pk) == [1, 2, 3]


def run_with_feed(sub: Subscription, session_id: int, scenario: Callable[[], Awaitable[None]]) -> None:
    """Run `scenario` with `sub` joined to its session's feed, as its task would be."""

    async def joined() -> None:
        sub.hub = get_hub()
        sub.feed = sub.hub.join(session_id, sub)
        try:
            await sub.hub.ready(sub.feed)
            await scenario()
        finally:
            await sub.hub.leave(sub.feed, sub)

    async_to_sync(joined)()


@pytest.mark.django_db(transaction=True)
def test_a_subscriber_that_falls_behind_resyncs_from_the_database(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subscription_module, "SUBSCRIBER_BACKLOG_MAX", 3)
    session = factories.SessionFactory()
    run = factories.RunFactory(session=session, status=RunStatus.RUNNING)
    journal.append_batch(run.pk, deltas(10), publish=False)
    send = Recorder()
    sub = Subscription(session.pk, {}, send)
    sub.followed, sub.sent, sub.floor = {run.pk}, {run.pk: 0}, run.pk
    for seq in range(1, 11):
        sub.push(batch(run.pk, session.pk, range(seq, seq + 1)))
    assert sub.overflowed and len(sub.backlog) < 3

    run_with_feed(sub, session.pk, sub.drain)

    assert send.seqs(run.pk) == list(range(1, 11))
    assert [f["type"] for f in send.frames].count("session") == 1


@pytest.mark.django_db(transaction=True)
def test_an_overflow_while_the_backlog_drains_is_replayed_before_what_was_queued_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What the feed queued after an overflow follows on from the replay, not from what this
    # socket sent before it: handled first, it would be a gap.
    monkeypatch.setattr(subscription_module, "SUBSCRIBER_BACKLOG_MAX", 3)
    session = factories.SessionFactory()
    run = factories.RunFactory(session=session, status=RunStatus.RUNNING)
    journal.append_batch(run.pk, deltas(10), publish=False)
    send = Recorder()
    sub = Subscription(session.pk, {}, send)
    sub.followed, sub.sent, sub.floor = {run.pk}, {run.pk: 0}, run.pk
    sub.push(batch(run.pk, session.pk, range(1, 3)))

    async def while_sending() -> None:
        send.on_send = None
        for seq in range(3, 7):  # the feed runs ahead meanwhile: the backlog overflows
            sub.push(batch(run.pk, session.pk, range(seq, seq + 1)))
        sub.push(batch(run.pk, session.pk, range(9, 11)))

    send.on_send = while_sending
    run_with_feed(sub, session.pk, sub.drain)

    assert send.seqs(run.pk) == list(range(1, 11))


@pytest.mark.django_db(transaction=True)
def test_plan_follows_cursors_the_active_run_and_runs_newer_than_the_floor() -> None:
    session = factories.SessionFactory()
    done = finished(session, 3)
    ignored = finished(session, 3)
    floor = run_floor(session.pk)
    late = finished(session, 3)
    active = factories.RunFactory(session=session, status=RunStatus.RUNNING)
    plan = plan_subscription(session.pk, {done.pk: 1, 999999: 0}, floor)
    assert plan.cursors == {done.pk: 1, late.pk: 0, active.pk: 0}
    assert ignored.pk not in plan.cursors
    assert plan.refused == {999999}
    assert plan.floor == active.pk


@pytest.mark.django_db(transaction=True)
def test_catch_up_of_a_page_arrives_in_events_frames_and_stops_at_the_terminal_event() -> None:
    session = factories.SessionFactory()
    run = finished(session, 30)
    send = Recorder()
    sub = Subscription(session.pk, {run.pk: 0}, send)
    sub.sent[run.pk] = 0
    sub.followed.add(run.pk)

    async_to_sync(sub.catch_up)(run.pk)

    assert send.wire == ["events"]
    assert send.seqs(run.pk) == list(range(1, 31))
    assert run.pk in sub.done


def test_a_live_batch_goes_out_as_one_events_frame_and_a_single_event_as_an_event_frame() -> None:
    send = Recorder()
    sub = following(send, {5: 0})

    async def scenario() -> None:
        await sub.deliver(batch(5, 1, range(1, 5)))
        await sub.deliver(batch(5, 1, range(3, 6)))  # 3 and 4 again: only 5 is new
        await sub.deliver(batch(5, 1, range(6, 8), terminal_at=7))
        await sub.deliver(batch(5, 1, range(8, 10)))  # nothing after the terminal

    async_to_sync(scenario)()
    assert send.wire == ["events", "event", "events"]
    assert send.seqs(5) == [1, 2, 3, 4, 5, 6, 7]
    assert 5 in sub.done


def test_an_idle_caught_up_socket_takes_frames_directly_and_any_other_is_queued() -> None:
    send = Recorder()
    sub = following(send, {7: 2})

    async def scenario() -> list[bool]:
        taken = [await sub.offer(batch(7, 1, range(3, 5)))]  # busy (not yet waiting): refused
        sub.idle = True
        taken.append(await sub.offer(batch(7, 1, range(3, 5))))  # follows on: sent now
        taken.append(await sub.offer(batch(7, 1, range(4, 6))))  # overlap: only 5 goes out
        taken.append(await sub.offer(batch(7, 1, range(8, 9))))  # a gap: never raised in the feed
        sub.push(batch(7, 1, range(9, 10)))
        taken.append(await sub.offer(batch(7, 1, range(6, 7))))  # something queued: keep order
        return taken

    assert async_to_sync(scenario)() == [False, True, True, False, False]
    assert send.seqs(7) == [3, 4, 5]
    assert send.wire == ["events", "event"]  # a batch in one frame, one event alone


def test_a_range_the_feed_could_not_read_ends_the_run_for_sockets_that_lack_it() -> None:
    send = Recorder()
    sub = following(send, {5: 3, 6: 9})
    error = error_frame("cursor_expired", "compacted", run_id=5)

    async def scenario() -> None:
        await sub.handle(RunUnreadable(5, 8, error))
        await sub.handle(RunUnreadable(6, 8, error))  # this socket replayed past it already
        await sub.deliver(batch(5, 1, range(9, 10)))
        await sub.deliver(batch(6, 1, range(10, 11)))

    async_to_sync(scenario)()
    assert send.frames[0] == orjson.loads(error)
    assert sub.refused == {5}
    assert send.seqs(5) == [] and send.seqs(6) == [10]
