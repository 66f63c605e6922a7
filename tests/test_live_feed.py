"""A session's feed (runs.live.feed): the one place that repairs seq gaps, once for all its sockets,
batched polls, and snapshots that never overtake the events that changed them."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import orjson
import pytest
from asgiref.sync import async_to_sync

from runs import journal, notify
from runs.journal import NewEvent
from runs.live import feed as feed_module
from runs.live import reads
from runs.live.feed import EventsItem, Item, RunUnreadable, SessionFeed
from runs.live.reads import HeadsWanted, Marker, PollState, RunHead
from runs.models import Run, RunStatus
from tests import factories


def deltas(count: int) -> list[NewEvent]:
    return [NewEvent("token.delta", {"message_id": "m", "delta": f"{i}"}) for i in range(count)]


def marker(title: str) -> Marker:
    """A marker that differs from another only by its title: the feed compares, never reads, them."""
    return Marker(None, title, "", None, None, None, 0, None)  # type: ignore[arg-type]


class Collector:
    """A feed's subscriber that takes everything at once: what went out, in order."""

    def __init__(self) -> None:
        self.items: list[tuple[Any, ...]] = []

    async def offer(self, item: EventsItem) -> bool:
        self.items.append(("events", item.run_id, [frame.seq for frame in item.frames]))
        return True

    def push(self, item: Item) -> None:
        self.items.append((type(item).__name__,))


def notification(run: Any, seqs: list[int], last_seq: int | None = None) -> dict[str, Any]:
    """The runner's notification of `run`'s events `seqs`, carried inline."""
    events = [{"run_id": run.pk, "session_id": run.session_id, "seq": s, "terminal": False} for s in seqs]
    return {"type": "run.events", "run_id": run.pk, "last_seq": last_seq or seqs[-1], "events": events}


def feed_of(run: Any, *subscribers: Collector, high: int = 0) -> SessionFeed:
    feed = SessionFeed(run.session_id)
    feed.heads, feed.floor = {run.pk: high}, run.pk - 1
    for subscriber in subscribers:
        feed.subscribers.add(subscriber)
    return feed


class CountedReads:
    """feed.read_page, counting its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []
        self.real = reads.read_page

    def __call__(self, run_id: int, after: int, upto: int | None = None) -> Any:
        self.calls.append((after, upto or 0))
        return self.real(run_id, after, upto)


@pytest.mark.django_db(transaction=True)
def test_a_notification_that_skips_seqs_is_filled_from_the_database_once_for_every_socket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = factories.RunFactory(status=RunStatus.RUNNING)
    journal.append_batch(run.pk, deltas(8), publish=False)
    counted = CountedReads()
    monkeypatch.setattr(feed_module, "read_page", counted)
    sockets = Collector(), Collector()
    feed = feed_of(run, *sockets, high=2)

    async_to_sync(feed.on_message)(notification(run, [6, 7, 8]))  # 3..5 were lost

    assert counted.calls == [(2, 8)]
    for socket in sockets:
        assert socket.items == [("events", run.pk, [3, 4, 5, 6, 7, 8])]
    assert feed.heads[run.pk] == 8


@pytest.mark.django_db(transaction=True)
def test_inline_events_go_out_up_to_a_gap_and_the_rest_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    run = factories.RunFactory(status=RunStatus.RUNNING)
    journal.append_batch(run.pk, deltas(5), publish=False)
    counted = CountedReads()
    monkeypatch.setattr(feed_module, "read_page", counted)
    socket = Collector()
    feed = feed_of(run, socket)

    async def scenario() -> None:
        await feed.on_message(notification(run, [1, 2, 4, 5]))
        await feed.on_message(notification(run, [4, 5]))  # late and duplicate: nothing new

    async_to_sync(scenario)()
    assert socket.items == [("events", run.pk, [1, 2]), ("events", run.pk, [3, 4, 5])]
    assert counted.calls == [(2, 5)]


@pytest.mark.django_db(transaction=True)
def test_a_range_the_feed_cannot_read_is_announced_not_skipped_in_silence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = factories.RunFactory(status=RunStatus.RUNNING)

    def compacted(run_id: int, after: int, upto: int | None = None) -> Any:
        raise journal.CursorExpired("compacted meanwhile")

    monkeypatch.setattr(feed_module, "read_page", compacted)
    pushed: list[Item] = []
    socket = Collector()
    socket.push = pushed.append  # type: ignore[method-assign]
    feed = feed_of(run, socket, high=2)

    async_to_sync(feed.on_message)(notification(run, [6]))

    (item,) = pushed
    assert isinstance(item, RunUnreadable) and (item.run_id, item.through) == (run.pk, 6)
    assert item.error is not None and orjson.loads(item.error)["code"] == "cursor_expired"
    assert feed.heads[run.pk] == 6  # what follows goes out again


@pytest.mark.django_db
@pytest.mark.parametrize("chunk", [1, 2, reads.POLL_CHUNK])
def test_one_batched_poll_reads_what_each_session_alone_would(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The hub polls all its feeds at once; each feed must see what its own poll would have.
    monkeypatch.setattr(reads, "POLL_CHUNK", chunk)
    busy, quiet, other = factories.SessionFactory(), factories.SessionFactory(), factories.SessionFactory()
    ended = factories.RunFactory(session=busy, status=RunStatus.COMPLETED, last_seq=4)
    active = factories.RunFactory(session=busy, status=RunStatus.RUNNING, last_seq=9)
    factories.PendingIntentFactory(session=busy)
    old = factories.RunFactory(session=quiet, status=RunStatus.FAILED, last_seq=2)
    newer = factories.RunFactory(session=quiet, status=RunStatus.COMPLETED, last_seq=3)
    factories.RunFactory(session=other, status=RunStatus.RUNNING)  # polled by nobody
    wanted = {
        busy.pk: HeadsWanted({ended.pk}, active.pk),
        quiet.pk: HeadsWanted(set(), old.pk),
        10**9: HeadsWanted(set(), 0),
    }

    states = reads.poll_states(wanted)

    assert set(states) == set(wanted)
    assert [h.run_id for h in states[busy.pk].heads] == [ended.pk, active.pk]
    assert [(h.run_id, h.last_seq) for h in states[quiet.pk].heads] == [(newer.pk, 3)]
    assert states[10**9] == ([], None)  # a deleted session: the feed reports it gone
    for session_id in (busy.pk, quiet.pk):
        alone = reads.poll_states({session_id: wanted[session_id]})[session_id]
        assert states[session_id] == alone
        assert states[session_id].marker == reads.session_marker(session_id, alone.heads)
    busy_marker = states[busy.pk].marker
    assert busy_marker is not None
    assert busy_marker.active == (active.pk, RunStatus.RUNNING)
    assert busy_marker.intents == 1


class SlowSnapshot:
    """reads.session_snapshot, held until released: a snapshot read that takes a while."""

    def __init__(self) -> None:
        self.reading = threading.Event()
        self.release = threading.Event()
        self.real = reads.session_snapshot
        self.reads = 0
        self.done = 0

    def __call__(self, session_id: int) -> dict[str, Any] | None:
        self.reads += 1
        read = self.reads
        self.reading.set()
        assert self.release.wait(30)
        snapshot = self.real(session_id)
        self.done += 1
        return None if snapshot is None else {**snapshot, "read": read}


SlowFeed = tuple[Any, SlowSnapshot, SessionFeed, Collector]


def slow_snapshot_feed(monkeypatch: pytest.MonkeyPatch) -> SlowFeed:
    """A running run, its session's feed with one subscriber, and snapshot reads held until released."""
    run = factories.RunFactory(status=RunStatus.RUNNING)
    slow = SlowSnapshot()
    monkeypatch.setattr(feed_module, "session_snapshot", slow)
    sub = Collector()
    return run, slow, feed_of(run, sub), sub


def first_event(run: Any, type: str) -> dict[str, Any]:
    """The runner's notification of `run`'s first event, of `type`, carried inline."""
    envelope = {"run_id": run.pk, "session_id": run.session_id, "seq": 1, "type": type}
    envelope["terminal"] = type == "done"
    return {"type": "run.events", "run_id": run.pk, "last_seq": 1, "events": [envelope]}


@pytest.mark.django_db(transaction=True)
def test_events_reach_sockets_while_the_snapshot_is_being_read(monkeypatch: pytest.MonkeyPatch) -> None:
    run, slow, feed, sub = slow_snapshot_feed(monkeypatch)

    async def scenario() -> None:
        check = asyncio.ensure_future(feed.check(PollState([], marker("changed"))))
        assert await asyncio.to_thread(slow.reading.wait, 30)
        # Not behind the snapshot's read:
        await asyncio.wait_for(feed.on_message(first_event(run, "token.delta")), 10)
        assert sub.items == [("events", run.pk, [1])]
        slow.release.set()
        await check

    async_to_sync(scenario)()
    assert sub.items == [("events", run.pk, [1]), ("SnapshotItem",)]
    assert feed.marker == marker("changed")


@pytest.mark.django_db(transaction=True)
def test_a_snapshot_read_before_a_state_event_is_not_sent_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    run, slow, feed, sub = slow_snapshot_feed(monkeypatch)

    async def scenario() -> None:
        check = asyncio.ensure_future(feed.check(PollState([], marker("before"))))
        assert await asyncio.to_thread(slow.reading.wait, 30)
        await feed.on_message(first_event(run, "done"))
        slow.release.set()
        await check
        # The stale read went nowhere and left the marker, so the check `done` woke reads again.
        assert sub.items == [("events", run.pk, [1])]
        assert feed.marker is None and feed.rung
        await feed.check(PollState([], marker("after")))

    async_to_sync(scenario)()
    assert sub.items == [("events", run.pk, [1]), ("SnapshotItem",)]


def test_doorbells_rung_together_cost_one_snapshot_check() -> None:
    # A turn's start rings for the submit, run.started and a title: one read serves them all.
    feed = SessionFeed(1)
    checked: list[int] = []  # feed.changes as each check began
    done = asyncio.Event()

    async def check(state: PollState | None = None) -> None:
        checked.append(feed.changes)
        done.set()

    feed.check = check  # type: ignore[method-assign]
    feed.started = True

    async def scenario() -> None:
        try:
            for _ in range(3):
                feed._changed()
                for _ in range(5):
                    await asyncio.sleep(0)  # the loop runs between notifications, as it would
            await asyncio.wait_for(done.wait(), 10)
            assert checked == [3]  # one check, after all three
            done.clear()
            feed._changed()  # a later one gets its own
            await asyncio.wait_for(done.wait(), 10)
        finally:
            await feed.stop()

    async_to_sync(scenario)()
    assert checked == [3, 4]


@pytest.mark.django_db(transaction=True)
def test_a_snapshot_read_while_a_poll_repairs_events_is_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without Redis events reach the feed by its poll, from the database: one of them may be
    # the `done` that makes a snapshot read just before it stale.
    run, slow, feed, sub = slow_snapshot_feed(monkeypatch)
    journal.append_batch(run.pk, deltas(1), publish=False)

    async def scenario() -> None:
        first = asyncio.ensure_future(feed.check(PollState([], marker("m"))))
        assert await asyncio.to_thread(slow.reading.wait, 30)  # the first snapshot read began
        await feed.lock.acquire()
        # The poll got the lock while the read went on: its events go out before the read's
        # result can (the lock is first come, first served).
        poll = asyncio.ensure_future(
            feed.check(PollState([RunHead(run.pk, 1, RunStatus.RUNNING)], marker("m")))
        )
        for _ in range(5):
            await asyncio.sleep(0)
        slow.release.set()
        while slow.done < 1:
            await asyncio.sleep(0.001)
        for _ in range(5):
            await asyncio.sleep(0)
        feed.lock.release()
        await first
        await poll

    async_to_sync(scenario)()
    assert sub.items == [("events", run.pk, [1]), ("SnapshotItem",)]
    assert feed.snapshot_frame is not None and '"read":2' in feed.snapshot_frame


def doorbell_feed(monkeypatch: pytest.MonkeyPatch, run: Run) -> tuple[SessionFeed, Collector]:
    """`run`'s session feed, as if subscribed through Redis, polling every 0.2 s, with one subscriber."""
    monkeypatch.setattr(feed_module, "poll_seconds", lambda crosses: 0.2)
    sub = Collector()
    feed = feed_of(run, sub)
    feed.crosses_processes, feed.channel = True, "a-channel"
    return feed, sub


@pytest.mark.django_db(transaction=True)
def test_with_a_doorbell_a_poll_reads_a_gap_only_once_it_outlived_a_poll_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = factories.RunFactory(status=RunStatus.RUNNING)
    journal.append_batch(run.pk, deltas(4), publish=False)
    counted = CountedReads()
    monkeypatch.setattr(feed_module, "read_page", counted)
    feed, sub = doorbell_feed(monkeypatch, run)

    def head(last_seq: int) -> PollState:
        return PollState([RunHead(run.pk, last_seq, RunStatus.RUNNING)], marker("m"))

    async def scenario() -> None:
        await feed.check(head(2))  # seqs 1-2 committed, their notification on its way
        assert counted.calls == []
        await feed.on_message(notification(run, [1, 2]))  # ... and here it is
        await feed.check(head(4))  # a newer gap, just seen
        await asyncio.sleep(0.25)
        await feed.check(head(4))  # 3-4 never came: a poll interval later they are read
        assert counted.calls == [(2, 4)]

    async_to_sync(scenario)()
    assert [item[2] for item in sub.items if item[0] == "events"] == [[1, 2], [3, 4]]


@pytest.mark.django_db(transaction=True)
def test_a_snapshot_showing_a_run_ended_waits_for_its_done_still_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = factories.RunFactory(status=RunStatus.RUNNING)
    journal.append_batch(run.pk, [*deltas(1), journal.done_event("completed")], publish=False)
    feed, sub = doorbell_feed(monkeypatch, run)
    ended = PollState([RunHead(run.pk, 2, RunStatus.COMPLETED)], marker("ended"))

    async def scenario() -> None:
        await feed.check(ended)
        assert sub.items == [] and feed.marker is None
        await asyncio.sleep(0.25)
        await feed.check(ended)  # the notification never came: read, then the snapshot

    async_to_sync(scenario)()
    assert sub.items == [("events", run.pk, [1, 2]), ("SnapshotItem",)]


class Recorder:
    """A subscriber that records the frames' seqs it is offered, and wakes whoever waits for them."""

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.arrived = asyncio.Event()

    async def offer(self, item: EventsItem) -> bool:
        self.seqs += [frame.seq for frame in item.frames]
        self.arrived.set()
        return True

    def push(self, item: Item) -> None:
        self.arrived.set()


@pytest.mark.django_db(transaction=True)
def test_an_idle_feed_holds_no_task_and_one_channel_serves_every_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Idle sockets' memory (bench/idle_sockets.py): a watched session costs no task, queue or
    # channel of its own; a session group's message still reaches its feed, and only its feed.
    first = factories.RunFactory(status=RunStatus.RUNNING)
    second = factories.RunFactory(status=RunStatus.RUNNING)
    rung: list[int] = []  # the sessions whose doorbell made a check (the hub's poll passes a state)
    real_check = SessionFeed.check

    async def check(self: SessionFeed, state: PollState | None = None) -> None:
        if state is None:
            rung.append(self.session_id)
        await real_check(self, state)

    monkeypatch.setattr(SessionFeed, "check", check)

    async def scenario() -> None:
        hub = feed_module.LiveHub()
        subs = Recorder(), Recorder()
        feeds = [hub.join(run.session_id, sub) for run, sub in zip((first, second), subs, strict=True)]
        try:
            for feed in feeds:
                await hub.ready(feed)
                assert (feed._drainer, feed._waker, feed.inbox) == (None, None, [])
            assert feeds[0].channel is not None and feeds[0].channel == feeds[1].channel
            layer = feed_module.get_channel_layer()
            envelope = {"run_id": first.pk, "session_id": first.session_id, "seq": 1, "terminal": False}
            message = notify.run_events_message(first.session_id, first.pk, [envelope])
            await layer.group_send(notify.session_group(first.session_id), message)
            await asyncio.wait_for(subs[0].arrived.wait(), 10)
            assert subs[0].seqs == [1] and subs[1].seqs == []
            changed = {"type": "session.changed", "session_id": second.session_id}
            await layer.group_send(notify.session_group(second.session_id), changed)
            while not rung:
                await asyncio.sleep(0.01)
            assert rung == [second.session_id]
            while any(feed._drainer or feed._waker for feed in feeds):
                await asyncio.sleep(0.01)  # each task ends once its work is done
        finally:
            for feed, sub in zip(feeds, subs, strict=True):
                await hub.leave(feed, sub)
        assert hub.feeds == {} and hub._journal is None

    async_to_sync(scenario)()


@pytest.mark.django_db(transaction=True)
def test_a_feed_stopping_while_its_session_is_joined_again_leaves_the_new_feed_its_doorbell(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A tab reloaded: its socket leaves as the new one joins. Both feeds share the hub's channel,
    # so the old one's leaving the session group must not take the new one's doorbell away.
    monkeypatch.setattr(feed_module, "poll_seconds", lambda crosses: 60.0)  # the doorbell alone
    run = factories.RunFactory(status=RunStatus.RUNNING)

    async def scenario() -> None:
        hub = feed_module.LiveHub()
        old_sub, new_sub = Recorder(), Recorder()
        old = hub.join(run.session_id, old_sub)
        await hub.ready(old)
        old._ring()  # a check under way: the old feed's stop waits for it
        leaving = asyncio.ensure_future(hub.leave(old, old_sub))
        await asyncio.sleep(0)  # it left the hub, and waits for the check to stop
        assert run.session_id not in hub.feeds and not leaving.done()
        new = hub.join(run.session_id, new_sub)
        assert new is not old
        await leaving
        await hub.ready(new)
        try:
            envelope = {"run_id": run.pk, "session_id": run.session_id, "seq": 1, "terminal": False}
            message = notify.run_events_message(run.session_id, run.pk, [envelope])
            await feed_module.get_channel_layer().group_send(notify.session_group(run.session_id), message)
            await asyncio.wait_for(new_sub.arrived.wait(), 10)
            assert new_sub.seqs == [1] and old_sub.seqs == []
        finally:
            await hub.leave(new, new_sub)

    async_to_sync(scenario)()
