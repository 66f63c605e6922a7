"""One socket's subscription to its session: replay from the client's cursors, then the feed's stream.

Design note: docs/live-delivery.md ("Order of operations", "Gap repair"). The subscription
joins its session's feed first, replays each followed run after its cursor from the
database, then forwards the feed's batches, dropping any `(run_id, seq)` at or below what it
already sent for that run. It repairs no gaps: the feed's batches follow on, and a batch that
does not is a broken contract (BrokenFeed: the socket closes with 4500 and the client resumes
from its cursors). Seqs are only ever compared within one run.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence

from runs import journal
from runs.live.feed import (
    EventsItem,
    Gone,
    Item,
    LiveHub,
    RunUnreadable,
    SessionFeed,
    SessionGone,
    SnapshotItem,
    get_hub,
)
from runs.live.outflow import Outflow, max_backlog_bytes
from runs.live.protocol import (
    FIRST_PAGE_EVENTS,
    EventFrame,
    error_frame,
    events_frames,
    page_events,
    socket_frames,
)
from runs.live.reads import plan_subscription, pooled, read_page, run_floor, run_heads
from runs.models import Run

# A subscriber this far behind its feed stops queueing and re-reads the database instead.
SUBSCRIBER_BACKLOG_MAX = 2000


def item_chars(item: Item) -> int:
    """The characters of the frames an item holds (what a backlog keeps alive)."""
    if isinstance(item, EventsItem):
        return sum(len(frame.text) for frame in item.frames)
    return len(item.text) if isinstance(item, SnapshotItem) else 0


class BrokenFeed(RuntimeError):
    """A feed batch skipped seqs this socket has not sent: the feed repairs gaps, so this is a bug."""


class Subscription:
    """One socket's view of a session: a cursor per run, never a seq sent twice."""

    # One per open socket: no per-instance dict.
    __slots__ = (
        "_backlog",
        "_ready",
        "_send",
        "_waiter",
        "after",
        "backlog_chars",
        "backlog_max_chars",
        "done",
        "feed",
        "floor",
        "followed",
        "generation",
        "hub",
        "idle",
        "outflow",
        "overflowed",
        "refused",
        "sent",
        "session_id",
        "snapshot_frame",
    )

    def __init__(
        self,
        session_id: int,
        after: dict[int, int],
        send: Callable[[str], Awaitable[None]],
        outflow: Outflow | None = None,
    ) -> None:
        self.session_id = session_id
        self.after = after
        self._send = send
        # The socket's unwritten bytes (runs.live.outflow): this task's sends wait for the
        # client to read, and the feed's skip a socket that has not.
        self.outflow = outflow
        self.sent: dict[int, int] = {}  # run id → highest seq sent on this socket
        self.followed: set[int] = set()
        self.refused: set[int] = set()
        self.done: set[int] = set()
        self.floor = 0  # runs above this id are new to this socket: followed from seq 0
        self.generation = 0
        self.snapshot_frame: str | None = None
        # Made on the first push and dropped once drained, like _waiter: an empty deque or an
        # Event is ~800 bytes of every idle socket (bench/idle_sockets.py).
        self._backlog: deque[Item] | None = None
        # Its frames' characters: a stalled socket's backlog holds at most a bound of them too.
        self.backlog_chars = 0
        self.backlog_max_chars = max_backlog_bytes()
        self.overflowed = False
        self.idle = False  # caught up, nothing queued, waiting for the feed
        self._ready = False  # something was pushed since the task last looked
        self._waiter: asyncio.Future[None] | None = None
        self.hub: LiveHub | None = None
        self.feed: SessionFeed | None = None

    # -------------------------------------------------------------- called by the feed

    def push(self, item: Item) -> None:
        """Queue an item; never blocks the feed. A subscriber that falls too far behind resyncs."""
        chars = item_chars(item)
        if self._backlog is None:
            self._backlog = deque()
        full = len(self._backlog) >= SUBSCRIBER_BACKLOG_MAX
        if full or self.backlog_chars + chars > self.backlog_max_chars:
            self._backlog.clear()
            self.backlog_chars = 0
            self.overflowed = True
        else:
            self._backlog.append(item)
            self.backlog_chars += chars
        self._ready = True
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def backlog(self) -> deque[Item]:
        """The items queued for this socket's task, oldest first (a copy when there are none)."""
        return self._backlog if self._backlog is not None else deque()

    async def offer(self, item: EventsItem) -> bool:
        """Send a batch now if this socket is idle and caught up, sparing its task a wake-up.

        False when it is not (busy, something queued, or the batch does not follow on): the
        feed pushes it instead, and the task handles it in order.
        """
        if not self.idle or self._backlog or self.overflowed:
            return False
        if self.outflow is not None and not self.outflow.has_room():
            return False
        run_id = item.run_id
        if not self._follows(run_id):
            return True  # not a run this socket shows
        sends = self._sends(item)
        if sends is None:
            return False
        try:
            await self._send_frames(run_id, sends, paced=False)
        except Exception:
            return False  # its own task meets the same error, and sent[] says what went out
        return True

    # -------------------------------------------------------------- the socket's task

    async def run(self) -> None:
        """Join, replay, stream until cancelled. Raises SessionGone when the session disappears."""
        try:
            await self._run()
        finally:
            if self.hub is not None and self.feed is not None:
                feed, self.feed = self.feed, None
                await self.hub.leave(feed, self)

    async def _run(self) -> None:
        floor_before = await pooled(run_floor)(self.session_id)
        self.hub = get_hub()
        self.feed = self.hub.join(self.session_id, self)
        await self.hub.ready(self.feed)
        plan = await pooled(plan_subscription)(self.session_id, self.after, floor_before)
        await self._send_snapshot(await self.feed.snapshot())
        for error in plan.errors:
            await self._send(error)
        self.floor = plan.floor
        self.refused = set(plan.refused)
        for run_id in sorted(plan.cursors):
            self.followed.add(run_id)
            self.sent[run_id] = plan.cursors[run_id]
            await self.catch_up(run_id)
        while True:
            self.idle = True
            try:
                await self._pushed()
            finally:
                self.idle = False
            await self.drain()

    async def _pushed(self) -> None:
        """Return once something was pushed since the last call."""
        if not self._ready:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        self._ready = False

    async def drain(self) -> None:
        """Handle the backlog in order; after an overflow, first replay what it dropped."""
        while self.overflowed or self._backlog:
            if self.overflowed:
                # Checked before every item: what was queued after an overflow follows on from
                # the replay, not from what this socket sent before it.
                self.overflowed = False
                await self.resync()
                continue
            item = self._backlog.popleft()
            self.backlog_chars -= item_chars(item)
            await self.handle(item)
        self._backlog = None

    async def handle(self, item: Item) -> None:
        match item:
            case EventsItem():
                await self.deliver(item)
            case SnapshotItem():
                await self._send_snapshot(item)
            case RunUnreadable(run_id, through, error):
                if self._follows(run_id) and self.sent[run_id] < through:
                    self.refused.add(run_id)
                    if error is not None:
                        await self._send(error)
            case Gone():
                raise SessionGone(self.session_id)

    def _follows(self, run_id: int) -> bool:
        if run_id in self.refused or run_id in self.done:
            return False
        if run_id not in self.followed:
            if run_id <= self.floor:
                return False  # neither asked for nor new
            self.followed.add(run_id)
            self.sent[run_id] = 0
        return True

    def _sends(self, item: EventsItem) -> Sequence[EventFrame] | None:
        """What this socket sends of a feed batch, as it goes on the wire; None if it does not follow on.

        A batch is consecutive and a run's terminal event is its last (the feed's and the journal's
        rules), so the new part is a slice: what this socket's replay sent already is skipped.
        """
        run_id, frames, wire = item
        skip = self.sent[run_id] + 1 - frames[0].seq
        if skip < 0:
            return None
        if skip == 0:
            return wire or socket_frames(run_id, frames)
        return socket_frames(run_id, frames[skip:]) if skip < len(frames) else ()

    async def deliver(self, item: EventsItem) -> None:
        run_id, frames, _ = item
        if not self._follows(run_id):
            return
        sends = self._sends(item)
        if sends is None:
            raise BrokenFeed(
                f"session {self.session_id}: run {run_id} batch from seq {frames[0].seq} "
                f"after seq {self.sent[run_id]}"
            )
        await self._send_frames(run_id, sends)

    async def _send_frames(self, run_id: int, frames: Iterable[EventFrame], paced: bool = True) -> None:
        """Send encoded frames of run_id in order, keeping what was sent up to date.

        `paced`: each waits for the client to have read the previous ones (outflow.TooSlow if it
        does not); only the feed's offer, which checked first, sends unpaced.
        """
        for seq, terminal, text in frames:
            if paced and self.outflow is not None:
                await self.outflow.room()
            await self._send(text)
            self.sent[run_id] = seq
            if terminal:
                self.done.add(run_id)

    async def catch_up(self, run_id: int) -> None:
        """Replay run_id's events after what this socket sent, from the database, in pages bounded
        in characters as well as in events (protocol.page_events)."""
        events = FIRST_PAGE_EVENTS
        while run_id not in self.done:
            try:
                after = self.sent[run_id]
                page = await pooled(read_page)(run_id, after, after + events)
            except journal.JournalError as exc:
                self.refused.add(run_id)
                await self._send(error_frame(exc.code, str(exc), run_id=run_id))
                return
            except Run.DoesNotExist:
                self.refused.add(run_id)
                return
            await self._send_frames(run_id, events_frames(run_id, page.rows))
            # has_more is counted up to the page's own bound: the run's last seq says what is left.
            if not page.rows or page.rows[-1][0] >= page.last_seq:
                return
            events = page_events(page.rows)

    async def resync(self) -> None:
        """The backlog was dropped: replay every followed run from the database, which has it all."""
        assert self.feed is not None
        pending = [
            run_id for run_id in self.followed if run_id not in self.done and run_id not in self.refused
        ]
        heads = await pooled(run_heads)(self.session_id, pending, self.floor)
        for head in heads:
            if self._follows(head.run_id):
                await self.catch_up(head.run_id)
        await self._send_snapshot(await self.feed.snapshot())

    async def _send_snapshot(self, snapshot: SnapshotItem) -> None:
        # Generations order the feed's reads: an older snapshot never follows a newer one.
        if snapshot.generation <= self.generation:
            return
        self.generation = snapshot.generation
        if snapshot.text != self.snapshot_frame:
            self.snapshot_frame = snapshot.text
            await self._send(snapshot.text)
