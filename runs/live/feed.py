"""One live source per watched session per web process (SessionFeed), and the process's hub (LiveHub).

Design note: docs/live-delivery.md ("The feed", "Gap repair"). The feed is the one place on the
server that repairs seq gaps: whatever a doorbell did not carry, or a poll finds missing, it
reads from the database once for all its sockets. Each run's batches leave it consecutive and
ascending, from the run's first event or from where the feed started; a range it cannot read
is announced (RunUnreadable), never skipped in silence.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings

from runs import journal, notify
from runs.event_loops import per_event_loop
from runs.journal.payloads import SESSION_STATE_EVENTS
from runs.live.doorbell import layer_down, poll_seconds, watch_layer
from runs.live.protocol import (
    FIRST_PAGE_EVENTS,
    EventFrame,
    envelope_frames,
    error_frame,
    page_events,
    row_frames,
    session_frame,
    socket_frames,
)
from runs.live.reads import (
    HeadsWanted,
    Marker,
    PollState,
    RunHead,
    feed_start_state,
    poll_states,
    read_page,
    session_marker,
    session_snapshot,
)
from runs.models import Run

log = logging.getLogger(__name__)

# A feed this far behind the journal notifications it was handed drops them and polls instead.
INBOX_MAX = 2000
# One snapshot check for the doorbells of a turn's start (submit, run.started, title).
WAKE_COALESCE_SECONDS = 0.025
# Events that may change the session snapshot (active run status, title), declared with each type.
STATE_EVENTS = SESSION_STATE_EVENTS


# ---------------------------------------------------------------- what a feed hands its subscribers


class EventsItem(NamedTuple):
    """Consecutive events of one run, ascending, following on from the feed's previous batch."""

    run_id: int
    frames: list[EventFrame]
    # The batch as a socket that sent everything before it sends it (socket_frames), encoded
    # once for all sockets; empty: each socket encodes it.
    wire: Sequence[EventFrame] = ()


class SnapshotItem(NamedTuple):
    generation: int  # ascending: an older snapshot never follows a newer one
    text: str  # the `session` frame


class RunUnreadable(NamedTuple):
    """The feed could not read `run_id`'s events up to `through` (compacted or deleted meanwhile)."""

    run_id: int
    through: int
    error: str | None  # the error frame for the client, if the journal gave a reason


class Gone(NamedTuple):
    """The session was deleted."""


Item = EventsItem | SnapshotItem | RunUnreadable | Gone


class Subscriber(Protocol):
    """A socket's end (Subscription): `offer` sends a batch now if nothing is ahead of it (False:
    push it instead); `push` queues an item and never blocks the feed."""

    async def offer(self, item: EventsItem) -> bool: ...

    def push(self, item: Item) -> None: ...


class SessionGone(Exception):
    pass


class SessionFeed:
    """One session's live source in this process: one group membership, many sockets."""

    def __init__(self, session_id: int) -> None:
        self.session_id = session_id
        self.subscribers: set[Subscriber] = set()
        self.heads: dict[int, int] = {}  # run id → highest seq broadcast
        self.watched: set[int] = set()  # runs still to be polled although no longer active
        # Run id → (a last_seq the database had that this feed had not broadcast, loop time first
        # seen): see _still_in_flight.
        self.gaps: dict[int, tuple[int, float]] = {}
        self.floor = 0  # runs up to this id that were not active at start are not followed
        self.newest = 0  # the poll also looks for runs above this id
        self.marker: Marker | None = None
        self.generation = 0
        self.snapshot_frame: str | None = None
        self.lock = asyncio.Lock()  # events go out in journal order, one batch at a time
        # Snapshot reads one at a time, so a slow read never overwrites a newer one.
        self.snapshot_lock = asyncio.Lock()
        self.changes = 0  # notifications that may have changed the snapshot, so far
        # A doorbell that may change the snapshot rang and no check has begun since. The check
        # runs on a task made only while rung (_waker): an idle feed holds no task and no Event.
        self.rung = False
        self._waker: asyncio.Task[None] | None = None
        self.channel: str | None = None  # the hub's channel, once it is in this session's group
        self.crosses_processes = bool(settings.REDIS_URL)
        self.started = False
        # This session's notifications from the hub's one channel, oldest first, taken whole by a
        # task made only while there are some (_drainer): no Queue or task per idle feed.
        self.inbox: list[dict[str, Any]] = []
        self._drainer: asyncio.Task[None] | None = None

    async def start(self, channel: str | None = None) -> None:
        """Put the hub's `channel` in this session's group, then read the database.

        In the group first: whatever commits after the read rings here.
        """
        layer = get_channel_layer()
        if layer is not None and channel is not None:
            try:
                await layer.group_add(notify.session_group(self.session_id), channel)
                self.channel = channel
            except Exception:
                log.warning(
                    "session %s: channel layer unavailable, polling only", self.session_id, exc_info=True
                )
        self.floor, heads, self.marker = await database_sync_to_async(feed_start_state)(self.session_id)
        self.newest = max([self.floor, *(head.run_id for head in heads)])
        self.heads = {head.run_id: head.last_seq for head in heads}
        self.watched = set(self.heads)
        self.started = True
        # What rang during the read is handled now.
        if self.inbox:
            self._drainer = asyncio.get_running_loop().create_task(self._inbox_loop())
        if self.rung:
            self._ring()

    async def stop(self) -> None:
        self.started = False  # nothing starts a task any more
        for task in (self._drainer, self._waker):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def leave_group(self) -> None:
        layer = get_channel_layer()
        if layer is not None and self.channel is not None:
            with contextlib.suppress(Exception):
                await layer.group_discard(notify.session_group(self.session_id), self.channel)

    # -------------------------------------------------------------- sources

    def doorbell_works(self) -> bool:
        # Now, not as at start: during a Redis outage the poll is the delivery (runs.live.doorbell).
        return self.crosses_processes and self.channel is not None and not layer_down()

    def poll_interval(self) -> float:
        return poll_seconds(self.doorbell_works())

    def poll_request(self) -> HeadsWanted:
        """What the hub's safety poll reads for this feed: runs still watched, and any newer run."""
        return HeadsWanted(set(self.watched), self.newest)

    def _ring(self) -> None:
        """Check the session soon; the rings until that check begins share it."""
        self.rung = True
        if self.started and self._waker is None:
            self._waker = asyncio.get_running_loop().create_task(self._wake_loop())

    async def _wake_loop(self) -> None:
        """A check per burst of doorbells that may change the snapshot, until none is left
        (the periodic safety poll is the hub's)."""
        try:
            while self.rung:
                # One read for all the rings of a turn's start, after the runner's claim and prompt
                # rather than beside them. Events never wait for this: they come inline.
                await asyncio.sleep(WAKE_COALESCE_SECONDS)
                self.rung = False
                try:
                    await self.check()
                except Exception:
                    log.exception("session %s: live check failed", self.session_id)
                    await asyncio.sleep(1.0)
        finally:
            if self._waker is asyncio.current_task():
                self._waker = None

    def post(self, message: dict[str, Any]) -> None:
        """A notification for this session from the hub, queued until this feed's start has read
        the database."""
        if len(self.inbox) >= INBOX_MAX:
            self._ring()  # far behind: the check reads what the dropped ones announced
            return
        self.inbox.append(message)
        if self.started and self._drainer is None:
            self._drainer = asyncio.get_running_loop().create_task(self._inbox_loop())

    async def _inbox_loop(self) -> None:
        """Handle the inbox in order until it is empty; the next post starts another."""
        try:
            while self.inbox:
                messages, self.inbox = self.inbox, []
                for message in merged_notifications(messages):
                    try:
                        await self.on_message(message)
                    except Exception:
                        log.exception("session %s: cannot handle a notification", self.session_id)
        finally:
            if self._drainer is asyncio.current_task():
                self._drainer = None

    async def on_message(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "run.events":
            events = message.get("events")
            async with self.lock:
                await self._advance(int(message["run_id"]), int(message["last_seq"]), events or [])
            if events is None or any(e.get("type") in STATE_EVENTS for e in events):
                self._changed()
        elif kind == "session.changed":
            self._changed()

    def _changed(self) -> None:
        self.changes += 1
        self._ring()

    async def check(self, state: PollState | None = None) -> None:
        """Broadcast what the doorbell missed and any change of the snapshot.

        The database is read outside the lock, so events keep flowing meanwhile. `state` may be
        older than something this feed did since (the hub's poll read it): an older head or
        marker only costs a redundant read.
        """
        if state is None:
            state = (await database_sync_to_async(poll_states)({self.session_id: self.poll_request()}))[
                self.session_id
            ]
        end_in_flight = False
        async with self.lock:
            for head in state.heads:
                if self._still_in_flight(head):
                    # A snapshot that shows the run ended goes out after its `done`, not before.
                    end_in_flight = end_in_flight or head.terminal
                    continue
                if await self._advance(head.run_id, head.last_seq, []):
                    # Read from the database, so perhaps state events: a snapshot read meanwhile
                    # is stale. This check reads its own after (no wake: without Redis every
                    # poll reads events, and a check per poll would double the polling).
                    self.changes += 1
                if head.terminal and self.heads.get(head.run_id) == head.last_seq:
                    self.watched.discard(head.run_id)
        if state.marker is None:
            self._broadcast(Gone())
        elif state.marker != self.marker and not end_in_flight:
            await self._refresh_snapshot(state.marker)

    def _still_in_flight(self, head: RunHead) -> bool:
        """Whether the events between what this feed broadcast and `head` may still be coming.

        With the doorbell across processes a poll nearly always finds the last commits'
        notifications on their way; reading them would hold the feed's lock, and its live
        events, behind the web's database thread. So a gap is read only once it has stayed
        open a poll interval. Without the doorbell the poll is the delivery: no grace.
        """
        if not self.doorbell_works():
            return False
        have = self.heads.get(head.run_id)
        if have is not None and have >= head.last_seq:
            self.gaps.pop(head.run_id, None)
            return False
        now = asyncio.get_running_loop().time()
        seen = self.gaps.get(head.run_id)
        if seen is not None and (have or 0) < seen[0] and now - seen[1] >= self.poll_interval():
            del self.gaps[head.run_id]
            return False  # the notifications for what was missing then never came
        if seen is None or (have or 0) >= seen[0]:
            self.gaps[head.run_id] = (head.last_seq, now)
        return True

    async def _refresh_snapshot(self, marker: Marker) -> None:
        """Read the snapshot and broadcast it if it changed, unless the session changed meanwhile.

        A snapshot read before an event that changed it (a run's `done`, say) must not reach
        sockets after that event: it is dropped, and read again by the next check.
        """
        async with self.snapshot_lock:
            changes = self.changes
            snapshot = await database_sync_to_async(session_snapshot)(self.session_id)
            async with self.lock:
                if changes != self.changes:
                    self._ring()  # usually rung already; read it again soon in any case
                    return
                self.marker = marker
                self._publish_snapshot(snapshot)

    # -------------------------------------------------------------- under the lock

    async def _advance(self, run_id: int, last_seq: int, inline: list[dict[str, Any]]) -> bool:
        """Broadcast run_id's events up to last_seq: the inline ones that follow on, the rest read
        from the database (the gap repair of live delivery). True if it read the database."""
        read = False
        high = self.heads.get(run_id)
        if high is None:
            if run_id <= self.floor:
                return False  # it ended before this feed started; subscribers replay it themselves
            high = 0  # a run that started since: follow it from its first event
            self.watched.add(run_id)
            self.newest = max(self.newest, run_id)
        fresh: list[dict[str, Any]] = []
        for envelope in inline:
            seq = envelope["seq"]
            if seq > high + len(fresh) + 1:
                break  # a gap: this and what follows come from the database
            if seq == high + len(fresh) + 1:
                fresh.append(envelope)
        if fresh:
            await self._fan_out(run_id, envelope_frames(fresh))
            high += len(fresh)
        target = max(last_seq, inline[-1]["seq"] if inline else 0)
        events = FIRST_PAGE_EVENTS  # pages bounded in characters, not only in events
        while high < target:
            try:
                page = await database_sync_to_async(read_page)(run_id, high, min(target, high + events))
            except (journal.JournalError, Run.DoesNotExist) as exc:
                # Compacted or deleted meanwhile: each subscriber that has not sent this range stops
                # following the run, with the journal's reason if it gave one.
                log.warning("session %s: cannot read run %s after seq %s", self.session_id, run_id, high)
                error = None
                if isinstance(exc, journal.JournalError):
                    error = error_frame(exc.code, str(exc), run_id=run_id)
                self._broadcast(RunUnreadable(run_id, target, error))
                high = target
                break
            if not page.rows:
                break
            read = True
            await self._fan_out(run_id, row_frames(page.rows))
            high = page.rows[-1][0]
            events = page_events(page.rows)
        self.heads[run_id] = high
        return read

    def _publish_snapshot(self, snapshot: dict[str, Any] | None) -> None:
        if snapshot is None:
            self._broadcast(Gone())
            return
        frame = session_frame(snapshot)
        if frame != self.snapshot_frame:
            self.generation += 1
            self.snapshot_frame = frame
            self._broadcast(SnapshotItem(self.generation, frame))

    async def _fan_out(self, run_id: int, frames: list[EventFrame]) -> None:
        """Send to each idle, caught-up socket now (sending never waits: daphne buffers it), which
        spares its task a wake-up per notification; queue for the others."""
        item = EventsItem(run_id, frames, tuple(socket_frames(run_id, frames)))
        for subscriber in tuple(self.subscribers):
            if not await subscriber.offer(item):
                subscriber.push(item)

    def _broadcast(self, item: Item) -> None:
        for subscriber in tuple(self.subscribers):
            subscriber.push(item)

    # -------------------------------------------------------------- for subscribers

    async def snapshot(self) -> SnapshotItem:
        """A snapshot read now (so no older than anything broadcast before), with its generation."""
        async with self.snapshot_lock, self.lock:
            self.marker = await database_sync_to_async(session_marker)(self.session_id)
            self._publish_snapshot(await database_sync_to_async(session_snapshot)(self.session_id))
            if self.marker is None or self.snapshot_frame is None:
                raise SessionGone(self.session_id)
            return SnapshotItem(self.generation, self.snapshot_frame)


def merged_notifications(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive notifications of one run whose inline events follow on, as one notification.

    A feed that fell behind then sends what queued up to each socket as one frame rather than
    one per notification: each send costs the web far more than an event in it (bench/README.md,
    round eleven). Nothing is reordered, and a notification without inline events stays alone.
    """
    out: list[dict[str, Any]] = []
    for message in messages:
        last = out[-1] if out else None
        if (
            last is not None
            and message.get("type") == last.get("type") == "run.events"
            and message.get("run_id") == last.get("run_id")
            and message.get("events")
            and last.get("events")
            and message["events"][0]["seq"] == last["events"][-1]["seq"] + 1
        ):
            out[-1] = {**message, "events": [*last["events"], *message["events"]]}
        else:
            out.append(message)
    return out


class LiveHub:
    """The feeds of one event loop (one web process), by session, their one channel-layer channel
    (the journal group and every watched session's group) and their one batched safety poll."""

    def __init__(self) -> None:
        self.feeds: dict[int, SessionFeed] = {}
        self._starting: dict[SessionFeed, asyncio.Future[None]] = {}
        self._poller: asyncio.Task[None] | None = None
        self._journal: asyncio.Task[None] | None = None
        # Resolves to the hub's channel (None: no layer) once it is in the journal group.
        self._journal_joined: asyncio.Future[str | None] | None = None
        self.channel: str | None = None  # that channel, while it is in the journal group
        self._watch: asyncio.Task[None] | None = None
        self._poked = asyncio.Event()  # the layer went down: poll now, not after the safety interval

    def join(self, session_id: int, subscriber: Subscriber) -> SessionFeed:
        if self._journal is None or self._journal.done():
            self._journal_joined = asyncio.get_running_loop().create_future()
            self._journal = asyncio.ensure_future(self._journal_loop(self._journal_joined))
        feed = self.feeds.get(session_id)
        if feed is None:
            feed = self.feeds[session_id] = SessionFeed(session_id)
            self._starting[feed] = asyncio.ensure_future(self._start(feed, self._journal_joined))
        feed.subscribers.add(subscriber)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.ensure_future(self._poll_loop())
        if settings.REDIS_URL and (self._watch is None or self._watch.done()):
            self._watch = asyncio.ensure_future(watch_layer(self._poked.set))
        return feed

    @staticmethod
    async def _start(feed: SessionFeed, journal_joined: asyncio.Future[str | None] | None) -> None:
        # Joined before the feed reads the database: whatever commits after that read reaches it.
        channel = None
        if journal_joined is not None:
            channel = await asyncio.shield(journal_joined)
        await feed.start(channel)

    async def _journal_loop(self, joined: asyncio.Future[str | None]) -> None:
        """The process's one channel: the runners' journal notifications (a message per group
        commit) and every watched session's group, each message posted to its session's feed.

        One channel, not one per feed: a channel-layer channel is a queue and a receiving task,
        ~4 KB of every watched session (bench/README.md, idle sockets).
        """
        layer = get_channel_layer()
        channel = None
        try:
            if layer is not None:
                channel = await layer.new_channel()
                await layer.group_add(notify.JOURNAL_GROUP, channel)
        except Exception:
            log.warning("channel layer unavailable: feeds poll the journal", exc_info=True)
            channel = None
        finally:
            if joined is self._journal_joined:  # not a loop that a teardown already replaced
                self.channel = channel
            joined.set_result(channel)
        if layer is None or channel is None:
            return
        try:
            while True:
                try:
                    message = await layer.receive(channel)
                except Exception:
                    # The safety poll covers the gap; the layer reconnects on the next receive.
                    log.warning("hub channel: receive failed", exc_info=True)
                    await asyncio.sleep(1.0)
                    continue
                try:
                    self._route(message)
                except Exception:
                    log.exception("hub channel: cannot route a message")
        finally:
            with contextlib.suppress(Exception):
                await layer.group_discard(notify.JOURNAL_GROUP, channel)

    def _route(self, message: dict[str, Any]) -> None:
        """A journal group commit to each run's feed; a session group's message to its feed."""
        # A session group carries run.events from synchronous code, and session.changed.
        journal_commit = message.get("type") == "journal.events"
        items = (message.get("runs") or ()) if journal_commit else (message,)
        for item in items:
            feed = self.feeds.get(int(item["session_id"]))
            if feed is not None:
                feed.post(item)

    def _started_feeds(self) -> list[SessionFeed]:
        return [feed for feed in self.feeds.values() if feed.started]

    async def _poll_loop(self) -> None:
        """Every feed's safety poll, batched: a few queries per interval whatever the feeds."""
        while self.feeds:
            feeds = self._started_feeds()
            interval = min((feed.poll_interval() for feed in feeds), default=poll_seconds(False))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poked.wait(), interval)
            self._poked.clear()
            feeds = self._started_feeds()
            if not feeds:
                continue
            try:
                states = await database_sync_to_async(poll_states)(
                    {feed.session_id: feed.poll_request() for feed in feeds}
                )
            except Exception:
                log.exception("live safety poll failed")
                await asyncio.sleep(1.0)
                continue
            for feed in feeds:
                if self.feeds.get(feed.session_id) is not feed:
                    continue  # it stopped while we read
                try:
                    await feed.check(states[feed.session_id])
                except Exception:
                    log.exception("session %s: live poll failed", feed.session_id)

    async def ready(self, feed: SessionFeed) -> None:
        # Shielded: one subscriber going away must not cancel the start others wait on.
        await asyncio.shield(self._starting[feed])

    async def leave(self, feed: SessionFeed, subscriber: Subscriber) -> None:
        feed.subscribers.discard(subscriber)
        if feed.subscribers:
            return
        if self.feeds.get(feed.session_id) is feed:
            del self.feeds[feed.session_id]
        starting = self._starting.pop(feed, None)
        if starting is not None:
            with contextlib.suppress(Exception):
                await starting
            await feed.stop()
            # A feed for this session that joined meanwhile is in the group on the same channel:
            # leaving it would take that feed's doorbell away.
            successor = self.feeds.get(feed.session_id)
            if successor is None or feed.channel != self.channel:
                await feed.leave_group()
        if not self.feeds:
            # Forgotten before the wait: a feed that joins meanwhile gets a channel of its own.
            tasks = (self._journal, self._watch)
            self._journal = self._watch = None
            self.channel = None
            for task in tasks:
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task


get_hub = per_event_loop(LiveHub)  # this event loop's LiveHub
