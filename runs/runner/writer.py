"""The run's journal writer: coalesce deltas, batch rows, keep order.

Token and reasoning deltas for the same segment merge for up to
HERMESWEB_COALESCE_MS (or until MAX_COALESCED_CHARS), so a fast model costs a
row per window, not per token. Any other event flushes what is buffered first,
in one transaction, so the journal order is exactly the arrival order.

Plain flushes of all the runs of a process are written together (`GroupCommit`):
one transaction holds whatever the runs handed over while the previous one was in
flight, so a runner commits once per group however many runs it holds, not once per
run per window. A flush that records a control (`also`, run updates)
keeps a transaction of its own.

A write the database did not answer (its connection lost under it, a restart) is read
back and made again only if it did not land: exactly once (`JournalWriter._write`,
docs/journal.md "Writes the database did not answer").

The window throttles rather than delays: a delta arriving when nothing was
written for a whole window is written at once (the first token of a turn reaches
the browser without waiting 30 ms); deltas arriving within a window of the last
write wait for that window to end. At most one flush is queued at a time — it
takes whatever the buffer holds when it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import weakref
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import InterfaceError, OperationalError, transaction

from runs import journal, notify, turns
from runs.journal import NewEvent
from runs.models import EventType, JournalEvent
from runs.runner.connections import LoopConnection, Retrying, revive, revived

log = logging.getLogger(__name__)

DELTA_TYPES = {EventType.TOKEN_DELTA: "message_id", EventType.REASONING_DELTA: "reasoning_id"}
MAX_COALESCED_CHARS = 8192
# Journal writes of different runs go to the database side by side: a flush spends most of
# its time waiting on round trips, and with asgiref's one shared thread a runner's runs
# queued behind each other's (100 runs at 50 tokens/s is ~3,000 flushes/s). Each thread has
# its own connection; one run's flushes stay in order under its writer's lock.
DB_THREADS = 4
_db_threads = ThreadPoolExecutor(max_workers=DB_THREADS, thread_name_prefix="journal-writer")


def close_db_threads() -> None:
    """Close the writer threads' database connections (a test database can then be dropped).

    The threads come back, with new connections, at the next write.
    """
    global _db_threads
    old, _db_threads = (
        _db_threads,
        ThreadPoolExecutor(max_workers=DB_THREADS, thread_name_prefix="journal-writer"),
    )
    # One task per thread: the barrier holds each until all are running, so every thread gets one.
    barrier = threading.Barrier(DB_THREADS)

    def close() -> None:
        from django.db import connections

        barrier.wait(timeout=10)
        connections.close_all()

    for future in [old.submit(close) for _ in range(DB_THREADS)]:
        with contextlib.suppress(Exception):
            future.result(timeout=15)
    old.shutdown(wait=True)


class JournalWriter:
    def __init__(self, run_id: int, window_ms: float | None = None, *, last_seq: int | None = None) -> None:
        self.run_id = run_id
        # The run's last seq this writer knows is committed: the claim's, then each write's.
        # Known, it makes a write the database did not answer exactly once (`_write`); None
        # (a writer not told where the run's journal stood) gives such a write up at once.
        self.last_seq = last_seq
        self.window = (settings.HERMESWEB_COALESCE_MS if window_ms is None else window_ms) / 1000.0
        self.buffer: list[NewEvent] = []
        self.buffered_chars = 0
        self._lock = asyncio.Lock()
        self._timer: asyncio.TimerHandle | None = None
        self._pending: set[asyncio.Task[Any]] = set()
        self._flush_queued = False  # a flush task exists that has not taken the buffer yet
        self._last_take = -float("inf")  # loop time deltas were last taken for writing
        # The last buffered delta's text while it grows (one row holds at most ~8 KiB of it).
        self._pieces: list[str] | None = None
        self._open_chars = 0
        self.closed = False
        # Told when a flush nobody awaits failed on its connection for good (`_write` gave up):
        # its events may be missing, so the run must not go on as if they were written.
        self.on_lost: Callable[[BaseException], None] | None = None

    def add(self, events: Sequence[NewEvent]) -> None:
        """Buffer events; schedules the flush. Never blocks the agent's reader."""
        if self.closed:
            return
        urgent = False
        for event in events:
            id_key = DELTA_TYPES.get(event.type)
            last = self.buffer[-1] if self.buffer else None
            delta = event.payload.get("delta", "") if id_key else ""
            if (
                id_key
                and last is not None
                and last.type == event.type
                and last.payload.get(id_key) == event.payload.get(id_key)
                and self._open_chars < MAX_COALESCED_CHARS
            ):
                # Joined once when taken: `+=` on a long string copies it for every token.
                if self._pieces is None:
                    self._pieces = [last.payload["delta"]]
                self._pieces.append(delta)
                self._open_chars += len(delta)
            else:
                self._seal()
                self.buffer.append(NewEvent(event.type, dict(event.payload)))
                self._open_chars = len(delta)
            if id_key:
                self.buffered_chars += len(delta)
            else:
                urgent = True
        if urgent or self.buffered_chars >= MAX_COALESCED_CHARS or self.window == 0:
            self._schedule(0)
        elif self._timer is None and self.buffer and not self._flush_queued:
            loop = asyncio.get_running_loop()
            wait = self._last_take + self.window - loop.time()
            if wait <= 0:
                self._schedule(0)
            else:
                self._timer = loop.call_later(wait, self._schedule, 0)

    def _schedule(self, _: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._flush_queued:
            return  # the queued flush has not run yet: it will take these events too
        self._flush_queued = True
        task = asyncio.get_running_loop().create_task(self.flush())
        self._pending.add(task)
        task.add_done_callback(self._flush_done)

    def _flush_done(self, task: asyncio.Task[Any]) -> None:
        self._pending.discard(task)
        if task.cancelled():
            # Cancelled before it took the buffer: let the next event schedule a flush again.
            self._flush_queued = False
            return
        exc = task.exception()
        if isinstance(exc, (OperationalError, InterfaceError)) and self.on_lost is not None:
            log.error("run %s: a journal write failed and could not be made again", self.run_id, exc_info=exc)
            self.on_lost(exc)

    async def flush(
        self, extra: Sequence[NewEvent] = (), *, also: Callable[[], None] | None = None, **run_updates: Any
    ) -> list[JournalEvent]:
        """Write the buffer (plus `extra`) in one transaction, after earlier flushes.

        `also` runs inside that transaction: a control's result is recorded
        atomically with the event that shows it.
        """
        async with self._lock:
            batch = self._take() + list(extra)
            if not batch:
                return []
            if also is None and not run_updates and not any(event.terminal for event in batch):

                def write() -> Awaitable[AppendResult]:
                    return group_commit().append(self.run_id, batch)
            else:

                def write() -> Awaitable[AppendResult]:
                    append = sync_to_async(_append, thread_sensitive=False, executor=_db_threads)
                    return append(self.run_id, batch, also, run_updates)

            rows, session_id, committed = await self._write(batch, write)
            if committed:
                # Publish from this loop, still under the lock so notifications keep journal
                # order. (Publishing on commit inside the database thread would park that thread
                # until the loop had sent it.) Awaited, not left to a task: when the loop is
                # saturated a queued notification waits behind everything else (measured: viewer
                # lag p50 ~130 ms awaited vs ~250-900 ms as tasks, 50 runs on one runner).
                await notify.apublish_events(session_id, self.run_id, journal.envelopes(rows, session_id))
            return rows

    def _take(self) -> list[NewEvent]:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._flush_queued = False
        # The window paces deltas: a take of other events alone (run.started, say) does not
        # hold back the delta after it, which may be the turn's first token.
        if any(event.type in DELTA_TYPES for event in self.buffer):
            self._last_take = asyncio.get_running_loop().time()
        self._seal()
        self._open_chars = 0
        batch, self.buffer, self.buffered_chars = self.buffer, [], 0
        return batch

    def _seal(self) -> None:
        if self._pieces is not None:
            self.buffer[-1].payload["delta"] = "".join(self._pieces)
            self._pieces = None

    async def finish(self, final: Sequence[NewEvent], **run_updates: Any) -> list[JournalEvent]:
        """Write the buffer and the final events (ending with `done`) and hand the session on."""
        async with self._lock:
            self.closed = True
            batch = self._take() + list(final)
            finish_run = sync_to_async(revived(turns.finish_run))

            async def write() -> AppendResult:
                return await finish_run(self.run_id, batch, **run_updates), 0, False  # published on commit

            rows, session_id, landed_unanswered = await self._write(batch, write)
            if landed_unanswered:  # its commit's own notifications never left
                await notify.apublish_events(session_id, self.run_id, journal.envelopes(rows, session_id))
                await sync_to_async(notify.publish_session_changed)(session_id)
            return rows

    async def _write(
        self, batch: list[NewEvent], write: Callable[[], Awaitable[AppendResult]]
    ) -> AppendResult:
        """`write()` the batch exactly once, through a lost connection or a database that is down.

        A write that fails on its connection (the server restarted, failed over, or dropped
        the connection under the statement) may have committed without the answer reaching
        us. The run's rows after `last_seq` say which: nothing there, it did not land and is
        written again; exactly this batch, it landed (and is for us to publish); anything
        else, someone else wrote the run (a reaper, so the lease is gone) and the error
        stands. Tried until HERMESWEB_DB_RETRY_SECONDS have passed, then the error
        stands and the run fails (execution.py, JOURNAL_LOST); the agent streams on into
        the buffer meanwhile.
        """
        retrying: Retrying | None = None  # made at the first failure: nothing on the common path
        while True:
            try:
                result = await write()
            except (OperationalError, InterfaceError) as exc:
                retrying = retrying or Retrying()
                if self.last_seq is None or retrying.over:
                    raise
                log.warning("run %s: a journal write went unanswered (%s); reading back", self.run_id, exc)
                landed = await self._read_back(batch, exc, retrying)
                if landed is None:
                    await retrying.pause()
                    continue
                log.warning("run %s: the unanswered journal write had landed", self.run_id)
                result = (*landed, True)
            if self.last_seq is not None and result[0]:
                self.last_seq = result[0][-1].seq
            return result

    async def _read_back(
        self, batch: list[NewEvent], error: Exception, retrying: Retrying
    ) -> tuple[list[JournalEvent], int] | None:
        """(rows, session id) if `batch` is what the run holds after `last_seq`; None if nothing is."""
        assert self.last_seq is not None
        read = sync_to_async(revived(journal.written_after), thread_sensitive=False, executor=_db_threads)
        while True:
            try:
                session_id, rows = await read(self.run_id, self.last_seq)
                break
            except (OperationalError, InterfaceError):
                if retrying.over:
                    raise error from None
                await retrying.pause()
        if not rows:
            return None
        if [(row.type, row.payload) for row in rows] == journal.as_written(batch):
            return rows, session_id
        if rows[-1].terminal:
            raise journal.AlreadyTerminal(f"run {self.run_id} ended while its write went unanswered")
        raise error


def _append(
    run_id: int, batch: list[NewEvent], also: Callable[[], None] | None, updates: dict[str, Any]
) -> tuple[list[JournalEvent], int, bool]:
    """Append in a transaction; (rows, session id, whether it committed here and is for us to publish)."""
    revive()
    if transaction.get_connection().in_atomic_block:
        # Someone's outer transaction decides when this commits: publish on that commit.
        with transaction.atomic():
            rows = journal.append_batch(run_id, batch, **updates)
            if also is not None:
                also()
        return rows, 0, False
    with transaction.atomic():
        rows, session_id = journal.append_unpublished(run_id, batch, **updates)
        if also is not None:
            also()
    return rows, session_id, True


AppendResult = tuple[list[JournalEvent], int, bool]


class GroupCommit:
    """One event loop's plain journal appends, written many runs to a transaction.

    While one group is in the database the next collects, so nothing waits when the
    runner is quiet and, under load, the commits per second stay near the number a
    database thread can do in a row, whatever the number of runs (bench/README.md,
    concurrency). The group's notifications go out together too (notify.apublish_many)
    before any of its flushes returns. A run never has two batches in one group: its
    writer's lock lets one flush at a time through.
    """

    def __init__(self) -> None:
        self._waiting: list[tuple[int, list[NewEvent], asyncio.Future[AppendResult]]] = []
        self._writing = False
        self._task: asyncio.Task[None] | None = None  # held: the loop keeps only a weak reference
        # PostgreSQL, in a runner: groups go from this loop on a connection of its own, not
        # through a database thread (two thread hops fewer on every first token).
        self.connection: LoopConnection | None = None

    def write_from_loop(self) -> None:
        """Send the groups from this loop, as a runner does (PostgreSQL; SQLite keeps its thread)."""
        if self.connection is None and notify.runners_listen():
            self.connection = LoopConnection()

    async def close(self) -> None:
        connection, self.connection = self.connection, None
        if connection is not None:
            await connection.discard()

    async def append(self, run_id: int, batch: list[NewEvent]) -> AppendResult:
        future: asyncio.Future[AppendResult] = asyncio.get_running_loop().create_future()
        self._waiting.append((run_id, batch, future))
        if not self._writing:
            self._writing = True
            self._task = asyncio.get_running_loop().create_task(self._write())
        return await future

    async def _write(self) -> None:
        try:
            while self._waiting:
                group, self._waiting = self._waiting, []
                items = [(run_id, batch) for run_id, batch, _ in group]
                try:
                    if self.connection is not None:
                        results = await self._write_on_loop(items)
                    else:
                        write = sync_to_async(_append_group, thread_sensitive=False, executor=_db_threads)
                        results = await write(items)
                except BaseException as exc:  # both answer per item: this is the executor's, or a cancel
                    for _, _, future in group:
                        if not future.done():
                            future.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                    continue
                # Published here, together, before any flush returns: a run's next flush
                # waits for its writer's lock, so its notifications keep journal order.
                await notify.apublish_many(
                    [
                        (result[1], run_id, journal.envelopes(result[0], result[1]))
                        for (run_id, _, _), result in zip(group, results, strict=True)
                        if not isinstance(result, BaseException) and result[2] and result[0]
                    ]
                )
                for (_, _, future), result in zip(group, results, strict=True):
                    if future.done():
                        continue  # its flush was cancelled; the rows are written all the same
                    if isinstance(result, BaseException):
                        future.set_exception(result)
                    else:
                        future.set_result((result[0], result[1], False))  # nothing left to publish
        finally:
            self._writing = False

    async def _write_on_loop(self, items: list[tuple[int, list[NewEvent]]]) -> list[AppendResult | Exception]:
        """_append_group's PostgreSQL statement on this loop's connection; the same answers."""
        assert self.connection is not None
        conn = None
        try:
            conn = await self.connection.get()
            results = await journal.aappend_group_unpublished(conn, items)
        except Exception as exc:
            if conn is not None and conn.closed:
                await self.connection.discard()
                # As _append_group: the connection was lost during the statement, so whether
                # the group committed is unknown and it is not written again here; each run's
                # writer reads back to find out (JournalWriter._write).
                log.warning("group commit of %d runs lost its connection", len(items), exc_info=True)
                lost = OperationalError(str(exc))
                lost.__cause__ = exc
                return [lost] * len(items)
            # Refused whole on a live connection (a lock timeout, a deadlock, a bad batch: in
            # autocommit the statement rolled back), or never sent: each batch alone, through
            # a database thread, so one bad batch cannot cost the others theirs.
            log.warning("group commit of %d runs failed; writing them one by one", len(items), exc_info=True)
            return await sync_to_async(_append_each, thread_sensitive=False, executor=_db_threads)(items)
        return [result if isinstance(result, Exception) else (*result, True) for result in results]


_groups: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GroupCommit] = weakref.WeakKeyDictionary()


def group_commit() -> GroupCommit:
    loop = asyncio.get_running_loop()
    group = _groups.get(loop)
    if group is None:
        group = _groups[loop] = GroupCommit()
    return group


def _append_group(items: list[tuple[int, list[NewEvent]]]) -> list[AppendResult | Exception]:
    """Append each (run id, events) in one transaction; per item its result or its refusal.

    A run that ended or vanished refuses its batch alone (journal.append_group_unpublished).
    Any other failure rolls the group back, and each batch is then written in a
    transaction of its own, so one bad batch cannot cost the others theirs.
    """
    revive()
    connection = transaction.get_connection()
    on_postgres = connection.vendor == "postgresql"
    if connection.in_atomic_block or (len(items) == 1 and not on_postgres):
        return _append_each(items)
    try:
        if on_postgres:
            # One statement that commits by itself: the group, even of one run, is one round
            # trip instead of three (UPDATE, INSERT, COMMIT) — ~2 ms of a first token here.
            results = journal.append_group_unpublished(items)
        else:
            with transaction.atomic():
                results = journal.append_group_unpublished(items)
    except Exception as exc:
        raw = connection.connection
        if on_postgres and (raw is None or raw.closed):
            # The connection was lost mid-statement (revive() saw it open): whether the group
            # committed is unknown, and writing it again here could journal it twice. Each
            # run's writer reads back to find out (JournalWriter._write). (Refused on a
            # connection that stays up, the statement rolled back; SQLite's transaction surely
            # did: either is written again below.)
            log.warning("group commit of %d runs lost its connection", len(items), exc_info=True)
            return [exc] * len(items)
        log.warning("group commit of %d runs failed; writing them one by one", len(items), exc_info=True)
        return _append_each(items)
    return [result if isinstance(result, Exception) else (*result, True) for result in results]


def _append_each(items: list[tuple[int, list[NewEvent]]]) -> list[AppendResult | Exception]:
    """Each (run id, events) in a transaction of its own: one bad batch costs only itself."""
    return [_append_alone(run_id, batch) for run_id, batch in items]


def _append_alone(run_id: int, batch: list[NewEvent]) -> AppendResult | Exception:
    try:
        return _append(run_id, batch, None, {})
    except Exception as exc:
        return exc
