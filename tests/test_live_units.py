"""runs.live without sockets: frame parsing, per-run dedupe, gap repair, overflow resync."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import orjson
import pytest
from asgiref.sync import async_to_sync

from runs import journal, live
from runs.journal import NewEvent
from runs.models import RunStatus
from tests import factories


def test_parse_accepts_ping_and_subscribe() -> None:
    assert live.parse_client_message('{"type": "ping"}') == live.Ping()
    assert live.parse_client_message('{"type": "subscribe"}') == live.Subscribe({})
    assert live.parse_client_message('{"type": "subscribe", "after": {"7": 3, "9": 0}}') == live.Subscribe(
        {7: 3, 9: 0}
    )


@pytest.mark.parametrize(
    "raw",
    [None, "", "{", "3", '{"type": 1}', '{"type": "subscribe", "after": {"٣": 1}}', "x" * 70000],
)
def test_parse_refuses_malformed_frames(raw: str | None) -> None:
    with pytest.raises(live.BadRequest):
        live.parse_client_message(raw)


class Recorder:
    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.wire: list[str] = []  # each frame's type as sent

    async def __call__(self, frame: str) -> None:
        decoded = orjson.loads(frame)
        self.wire.append(decoded["type"])
        if decoded["type"] == "events":  # catch-up: a page in one frame, read as its events
            self.frames.extend({"type": "event", "event": event} for event in decoded["events"])
        else:
            self.frames.append(decoded)

    def seqs(self, run_id: int) -> list[int]:
        return [
            f["event"]["seq"] for f in self.frames if f["type"] == "event" and f["event"]["run_id"] == run_id
        ]


def batch(
    run_id: int, session_id: int, seqs: range, terminal_at: int | None = None
) -> list[tuple[int, bool, str]]:
    return [
        (
            seq,
            seq == terminal_at,
            live.event_frame(
                {"run_id": run_id, "session_id": session_id, "seq": seq, "terminal": seq == terminal_at}
            ),
        )
        for seq in seqs
    ]


def finished(session: Any, count: int) -> Any:
    events = [("token.delta", {"message_id": "m", "delta": "x"})] * (count - 1) + [
        ("done", {"state": "completed"})
    ]
    return factories.run_with_events(events, session=session)


def deltas(count: int) -> list[NewEvent]:
    return [NewEvent("token.delta", {"message_id": "m", "delta": f"{i}"}) for i in range(count)]


@pytest.mark.django_db(transaction=True)
def test_dedupe_is_per_run_and_gaps_are_read_from_the_database() -> None:
    session = factories.SessionFactory()
    old = finished(session, 50)
    run = factories.RunFactory(session=session, status=RunStatus.RUNNING)
    journal.append_batch(run.pk, deltas(8), publish=False)
    send = Recorder()
    sub = live.Subscription(session.pk, {}, send)
    sub.followed = {old.pk, run.pk}
    sub.sent = {old.pk: 50, run.pk: 0}

    async def scenario() -> None:
        await sub.deliver(run.pk, batch(run.pk, session.pk, range(1, 3)))
        await sub.deliver(run.pk, batch(run.pk, session.pk, range(1, 3)))  # a duplicate notification
        await sub.deliver(run.pk, batch(run.pk, session.pk, range(6, 9)))  # 3..5 were lost

    async_to_sync(scenario)()
    assert send.seqs(run.pk) == list(range(1, 9))
    assert send.seqs(old.pk) == []


@pytest.mark.django_db(transaction=True)
def test_runs_neither_asked_for_nor_new_are_ignored_and_new_ones_start_at_one() -> None:
    session = factories.SessionFactory()
    older = finished(session, 3)
    newer = factories.RunFactory(session=session, status=RunStatus.RUNNING)
    journal.append_batch(newer.pk, deltas(3), publish=False)
    send = Recorder()
    sub = live.Subscription(session.pk, {}, send)
    sub.floor = older.pk

    async def scenario() -> None:
        await sub.deliver(older.pk, batch(older.pk, session.pk, range(2, 4)))
        await sub.deliver(newer.pk, batch(newer.pk, session.pk, range(3, 4)))

    async_to_sync(scenario)()
    assert send.seqs(older.pk) == []
    assert send.seqs(newer.pk) == [1, 2, 3]


@pytest.mark.django_db(transaction=True)
def test_a_subscriber_that_falls_behind_resyncs_from_the_database(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "SUBSCRIBER_BACKLOG_MAX", 3)
    session = factories.SessionFactory()
    run = factories.RunFactory(session=session, status=RunStatus.RUNNING)
    journal.append_batch(run.pk, deltas(10), publish=False)
    send = Recorder()
    sub = live.Subscription(session.pk, {}, send)
    sub.followed, sub.sent, sub.floor = {run.pk}, {run.pk: 0}, run.pk
    for seq in range(1, 11):
        sub.push(("events", run.pk, batch(run.pk, session.pk, range(seq, seq + 1))))
    assert sub.overflowed and len(sub.backlog) < 3

    async def scenario() -> None:
        sub.hub = live.get_hub()
        sub.feed = sub.hub.join(session.pk, sub)
        try:
            await sub.hub.ready(sub.feed)
            await sub.resync()
            while sub.backlog:
                await sub.handle(sub.backlog.popleft())
        finally:
            await sub.hub.leave(sub.feed, sub)

    async_to_sync(scenario)()
    assert send.seqs(run.pk) == list(range(1, 11))
    assert [f["type"] for f in send.frames].count("session") == 1


@pytest.mark.django_db(transaction=True)
def test_plan_follows_cursors_the_active_run_and_runs_newer_than_the_floor() -> None:
    session = factories.SessionFactory()
    done = finished(session, 3)
    ignored = finished(session, 3)
    floor = live.run_floor(session.pk)
    late = finished(session, 3)
    active = factories.RunFactory(session=session, status=RunStatus.RUNNING)
    plan = live.plan_subscription(session.pk, {done.pk: 1, 999999: 0}, floor)
    assert plan.cursors == {done.pk: 1, late.pk: 0, active.pk: 0}
    assert ignored.pk not in plan.cursors
    assert plan.refused == {999999}
    assert plan.floor == active.pk


def test_catch_up_frames_carry_consecutive_envelopes_under_the_size_limit(monkeypatch: Any) -> None:
    monkeypatch.setattr(live, "CATCHUP_FRAME_CHARS", 100)
    pad = {3: "x" * 150}  # too big to share a frame; the others are 28 characters each
    rows = [(seq, seq == 6, f'{{"seq":{seq},"pad":"{pad.get(seq, "x" * 10)}"}}') for seq in range(1, 7)]

    frames = list(live.events_frames(9, rows))

    decoded = [orjson.loads(frame) for _, _, frame in frames]
    assert all(f["type"] == "events" and f["run_id"] == 9 for f in decoded)
    # In order, each once, as many per frame as fit; the oversized envelope travels alone.
    assert [[e["seq"] for e in f["events"]] for f in decoded] == [[1, 2], [3], [4, 5, 6]]
    assert [(seq, terminal) for seq, terminal, _ in frames] == [(2, False), (3, False), (6, True)]


@pytest.mark.django_db(transaction=True)
def test_catch_up_of_a_page_arrives_in_events_frames_and_stops_at_the_terminal_event() -> None:
    session = factories.SessionFactory()
    run = finished(session, 30)
    send = Recorder()
    subscription = live.Subscription(session.pk, {run.pk: 0}, send)
    subscription.sent[run.pk] = 0
    subscription.followed.add(run.pk)

    async_to_sync(subscription.catch_up)(run.pk)

    assert send.wire == ["events"]
    assert send.seqs(run.pk) == list(range(1, 31))
    assert run.pk in subscription.done


def test_a_live_batch_goes_out_as_one_events_frame_and_a_single_event_as_an_event_frame() -> None:
    send = Recorder()
    sub = live.Subscription(1, {}, send)
    sub.followed.add(5)
    sub.sent = {5: 0}

    async def scenario() -> None:
        await sub.deliver(5, batch(5, 1, range(1, 5)))
        await sub.deliver(5, batch(5, 1, range(3, 6)))  # 3 and 4 again: only 5 is new
        await sub.deliver(5, batch(5, 1, range(6, 10), terminal_at=7))  # nothing after the terminal

    async_to_sync(scenario)()
    assert send.wire == ["events", "event", "events"]
    assert send.seqs(5) == [1, 2, 3, 4, 5, 6, 7]
    assert 5 in sub.done


@pytest.mark.django_db
@pytest.mark.parametrize("chunk", [1, 2, live.POLL_CHUNK])
def test_one_batched_poll_reads_what_each_session_alone_would(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The hub polls all its feeds at once; each feed must see what its own poll would have.
    monkeypatch.setattr(live, "POLL_CHUNK", chunk)
    busy, quiet, other = factories.SessionFactory(), factories.SessionFactory(), factories.SessionFactory()
    ended = factories.RunFactory(session=busy, status=RunStatus.COMPLETED, last_seq=4)
    active = factories.RunFactory(session=busy, status=RunStatus.RUNNING, last_seq=9)
    factories.PendingIntentFactory(session=busy)
    old = factories.RunFactory(session=quiet, status=RunStatus.FAILED, last_seq=2)
    newer = factories.RunFactory(session=quiet, status=RunStatus.COMPLETED, last_seq=3)
    factories.RunFactory(session=other, status=RunStatus.RUNNING)  # polled by nobody
    wanted = {busy.pk: ({ended.pk}, active.pk), quiet.pk: (set(), old.pk), 10**9: (set(), 0)}

    states = live.poll_states(wanted)

    assert set(states) == set(wanted)
    assert [h.run_id for h in states[busy.pk][0]] == [ended.pk, active.pk]
    assert [(h.run_id, h.last_seq) for h in states[quiet.pk][0]] == [(newer.pk, 3)]
    assert states[10**9] == ([], None)  # a deleted session: the feed reports it gone
    for session_id in (busy.pk, quiet.pk):
        alone = live.poll_states({session_id: wanted[session_id]})[session_id]
        assert states[session_id] == alone
        assert states[session_id][1] == live.session_marker(session_id, alone[0])
    busy_marker = states[busy.pk][1]
    assert busy_marker is not None
    assert busy_marker[-1] == (active.pk, RunStatus.RUNNING)
    assert busy_marker[-2] == 1  # one open intent


def test_an_idle_caught_up_socket_takes_frames_directly_and_any_other_is_queued() -> None:
    send = Recorder()
    sub = live.Subscription(1, {}, send)
    sub.followed, sub.sent = {7}, {7: 2}

    async def scenario() -> list[bool]:
        taken = [await sub.offer(7, batch(7, 1, range(3, 5)))]  # busy (not yet waiting): refused
        sub._idle = True
        taken.append(await sub.offer(7, batch(7, 1, range(3, 5))))  # follows on: sent now
        taken.append(await sub.offer(7, batch(7, 1, range(4, 6))))  # overlap: only 5 goes out
        taken.append(await sub.offer(7, batch(7, 1, range(8, 9))))  # a gap: for the task to read
        sub.push(("events", 7, batch(7, 1, range(9, 10))))
        taken.append(await sub.offer(7, batch(7, 1, range(6, 7))))  # something queued: keep order
        return taken

    assert async_to_sync(scenario)() == [False, True, True, False, False]
    assert send.seqs(7) == [3, 4, 5]
    assert send.wire == ["events", "event"]  # a batch in one frame, one event alone


class Collector:
    """A feed's subscriber that takes everything at once: what went out, in order."""

    def __init__(self) -> None:
        self.items: list[tuple[Any, ...]] = []

    async def offer(self, run_id: int, frames: list[live.Frame]) -> bool:
        self.items.append(("events", run_id, [seq for seq, _, _ in frames]))
        return True

    def push(self, item: live.Item) -> None:
        self.items.append(item[:1])


class SlowSnapshot:
    """live.session_snapshot, held until released: a snapshot read that takes a while."""

    def __init__(self) -> None:
        self.reading = threading.Event()
        self.release = threading.Event()
        self.real = live.session_snapshot
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


SlowFeed = tuple[Any, SlowSnapshot, live.SessionFeed, Collector]


def slow_snapshot_feed(monkeypatch: pytest.MonkeyPatch) -> SlowFeed:
    """A running run, its session's feed with one subscriber, and snapshot reads held until released."""
    session = factories.SessionFactory()
    run = factories.RunFactory(session=session, status=RunStatus.RUNNING)
    slow = SlowSnapshot()
    monkeypatch.setattr(live, "session_snapshot", slow)
    feed = live.SessionFeed(session.pk)
    feed.heads, feed.floor = {run.pk: 0}, run.pk - 1
    sub = Collector()
    feed.subscribers.add(sub)  # type: ignore[arg-type]
    return run, slow, feed, sub


def first_event(run: Any, type: str) -> dict[str, Any]:
    """The runner's notification of `run`'s first event, of `type`, carried inline."""
    envelope = {"run_id": run.pk, "session_id": run.session_id, "seq": 1, "type": type}
    envelope["terminal"] = type == "done"
    return {"type": "run.events", "run_id": run.pk, "last_seq": 1, "events": [envelope]}


@pytest.mark.django_db(transaction=True)
def test_events_reach_sockets_while_the_snapshot_is_being_read(monkeypatch: pytest.MonkeyPatch) -> None:
    run, slow, feed, sub = slow_snapshot_feed(monkeypatch)

    async def scenario() -> None:
        check = asyncio.ensure_future(feed.check(([], ("changed",))))
        assert await asyncio.to_thread(slow.reading.wait, 30)
        # Not behind the snapshot's read:
        await asyncio.wait_for(feed.on_message(first_event(run, "token.delta")), 10)
        assert sub.items == [("events", run.pk, [1])]
        slow.release.set()
        await check

    async_to_sync(scenario)()
    assert sub.items == [("events", run.pk, [1]), ("session",)]
    assert feed.marker == ("changed",)


@pytest.mark.django_db(transaction=True)
def test_a_snapshot_read_before_a_state_event_is_not_sent_after_it(monkeypatch: pytest.MonkeyPatch) -> None:
    run, slow, feed, sub = slow_snapshot_feed(monkeypatch)

    async def scenario() -> None:
        check = asyncio.ensure_future(feed.check(([], ("before",))))
        assert await asyncio.to_thread(slow.reading.wait, 30)
        await feed.on_message(first_event(run, "done"))
        slow.release.set()
        await check
        # The stale read went nowhere and left the marker, so the check `done` woke reads again.
        assert sub.items == [("events", run.pk, [1])]
        assert feed.marker is None and feed.wake.is_set()
        await feed.check(([], ("after",)))

    async_to_sync(scenario)()
    assert sub.items == [("events", run.pk, [1]), ("session",)]


def test_doorbells_rung_together_cost_one_snapshot_check() -> None:
    # A turn's start rings for the submit, run.started and a title: one read serves them all.
    feed = live.SessionFeed(1)
    checked: list[int] = []  # feed.changes as each check began
    done = asyncio.Event()

    async def check(state: live.PollState | None = None) -> None:
        checked.append(feed.changes)
        done.set()

    feed.check = check  # type: ignore[method-assign]

    async def scenario() -> None:
        loop = asyncio.ensure_future(feed._wake_loop())
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
            loop.cancel()

    async_to_sync(scenario)()
    assert checked == [3, 4]


@pytest.mark.django_db(transaction=True)
def test_a_snapshot_read_while_a_poll_repairs_events_is_read_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without Redis events reach the feed by its poll, from the database: one of them may be
    # the `done` that makes a snapshot read just before it stale.
    run, slow, feed, sub = slow_snapshot_feed(monkeypatch)
    journal.append_batch(run.pk, deltas(1), publish=False)

    async def scenario() -> None:
        first = asyncio.ensure_future(feed.check(([], ("m",))))
        assert await asyncio.to_thread(slow.reading.wait, 30)  # the first snapshot read began
        await feed.lock.acquire()
        # The poll got the lock while the read went on: its events go out before the read's
        # result can (the lock is first come, first served).
        poll = asyncio.ensure_future(feed.check(([live.RunHead(run.pk, 1, RunStatus.RUNNING)], ("m",))))
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
    assert sub.items == [("events", run.pk, [1]), ("session",)]
    assert feed.snapshot_frame is not None and '"read":2' in feed.snapshot_frame


def doorbell_feed(monkeypatch: pytest.MonkeyPatch, run: Any) -> tuple[live.SessionFeed, Collector]:
    """`run`'s session feed, as if subscribed through Redis, polling every 0.2 s, with one subscriber."""
    monkeypatch.setattr(live, "poll_seconds", lambda crosses: 0.2)
    feed = live.SessionFeed(run.session_id)
    feed.crosses_processes, feed.channel = True, "a-channel"
    feed.heads, feed.floor = {run.pk: 0}, run.pk - 1
    sub = Collector()
    feed.subscribers.add(sub)  # type: ignore[arg-type]
    return feed, sub


@pytest.mark.django_db(transaction=True)
def test_with_a_doorbell_a_poll_reads_a_gap_only_once_it_outlived_a_poll_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session = factories.SessionFactory()
    run = factories.RunFactory(session=session, status=RunStatus.RUNNING)
    journal.append_batch(run.pk, deltas(4), publish=False)
    reads: list[tuple[int, int]] = []
    real_read_page = live.read_page

    def read_page(run_id: int, after: int, upto: int | None = None) -> Any:
        reads.append((after, upto or 0))
        return real_read_page(run_id, after, upto)

    monkeypatch.setattr(live, "read_page", read_page)
    feed, sub = doorbell_feed(monkeypatch, run)

    def head(last_seq: int) -> live.PollState:
        return [live.RunHead(run.pk, last_seq, RunStatus.RUNNING)], ("m",)

    def notification(seqs: range) -> dict[str, Any]:
        events = [{"run_id": run.pk, "session_id": session.pk, "seq": seq, "terminal": False} for seq in seqs]
        return {"type": "run.events", "run_id": run.pk, "last_seq": seqs[-1], "events": events}

    async def scenario() -> None:
        await feed.check(head(2))  # seqs 1-2 committed, their notification on its way
        assert reads == []
        await feed.on_message(notification(range(1, 3)))  # ... and here it is
        await feed.check(head(4))  # a newer gap, just seen
        await asyncio.sleep(0.25)
        await feed.check(head(4))  # 3-4 never came: a poll interval later they are read
        assert reads == [(2, 4)]

    async_to_sync(scenario)()
    assert [item[2] for item in sub.items if item[0] == "events"] == [[1, 2], [3, 4]]


@pytest.mark.django_db(transaction=True)
def test_a_snapshot_showing_a_run_ended_waits_for_its_done_still_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    session = factories.SessionFactory()
    run = factories.RunFactory(session=session, status=RunStatus.RUNNING)
    journal.append_batch(run.pk, [*deltas(1), journal.done_event("completed")], publish=False)
    feed, sub = doorbell_feed(monkeypatch, run)
    ended: live.PollState = ([live.RunHead(run.pk, 2, RunStatus.COMPLETED)], ("ended",))

    async def scenario() -> None:
        await feed.check(ended)
        assert sub.items == [] and feed.marker is None
        await asyncio.sleep(0.25)
        await feed.check(ended)  # the notification never came: read, then the snapshot

    async_to_sync(scenario)()
    assert sub.items == [("events", run.pk, [1, 2]), ("session",)]


@pytest.mark.django_db
def test_a_socket_submit_that_finds_the_database_unavailable_is_refused_as_503(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.contrib.sessions.backends.db import SessionStore
    from django.db import OperationalError
    from django.test import Client

    from runs import services
    from runs.schemas import MessageIn

    session = factories.SessionFactory()

    def unreachable(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("server closed the connection unexpectedly")

    user = session.project.owner
    client = Client()
    client.force_login(user)  # a signed-in socket's scope: its user and its session
    scope = {"user": user, "session": SessionStore(client.session.session_key)}
    monkeypatch.setattr(services, "do_submit_message_as", unreachable)
    message = live.Submit(MessageIn(client_id="c-1", text="hello"))

    frame, signed_out = live.answer_submit(scope, session.pk, message)

    assert not signed_out
    answer = orjson.loads(frame)
    assert answer["client_id"] == "c-1"
    assert answer["error"]["status"] == 503 and answer["error"]["code"] == "database_unavailable"
