"""The run's journal writer: coalesce deltas, batch rows, keep order, write each batch exactly once.

Design note: docs/runner.md ("The package", "Losing the database"); docs/journal.md
("Writes the database did not answer").

Deltas first pass a DeltaGuard (runs/runner/redact_stream.py), which holds back a stream's
tail while it could still be the start of a secret, so no row boundary splits one (the
journal redacts row by row; docs/security.md, "Redaction").

Token and reasoning deltas of one segment merge (runs/runner/coalesce.py) for up to
HERMESWEB_COALESCE_MS, or MAX_COALESCED_CHARS, so a fast model costs a row per window,
not per token. Any other event flushes what is buffered first, in one transaction, so the
journal order is exactly the arrival order.

The window throttles rather than delays: a delta arriving when nothing was written for a
whole window is written at once (a turn's first token does not wait for the window);
deltas arriving within a window of the last write wait for that window to end. At most
one flush is queued at a time — it takes whatever the buffer holds when it runs.

How a flush is written:
- plain events go to the event loop's `GroupCommit`: one transaction (on PostgreSQL one
  statement) holds what all the runs of the process handed over while the previous group
  was in flight, so a runner commits once per group, not once per run per window. The group
  goes from the loop on its own connection in a PostgreSQL runner (`GroupCommit.commit_from_loop`),
  else from a database thread (`write_group`). A group the database refuses is written again
  batch by batch (`write_refused_group`), so one bad batch costs only itself;
- a flush that records a control (`also`), updates the run or ends it keeps a transaction
  of its own (`write_alone`), and the turn's last one goes through `turns.finish_run`;
- a write the database did not answer (its connection lost under it, a restart) is read
  back, and made again only if it did not land (`JournalWriter` "exactly once").

Once committed, a flush's notification goes to the loop's `Publisher` (runs/runner/publisher.py:
one task, in commit order) and the run's lock is let go, so the run's next batch (a turn's first
token behind run.started) commits while it is published; the flush returns once it has left.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import InterfaceError, OperationalError, transaction

from runs import journal, notify, turns
from runs.event_loops import per_event_loop
from runs.journal import NewEvent
from runs.journal.payloads import SIDEBAR_EVENTS
from runs.models import JournalEvent
from runs.runner.coalesce import Coalescer
from runs.runner.connections import LoopConnection, Retrying, revive, revived
from runs.runner.publisher import Publisher, RunEvents
from runs.runner.redact_stream import DeltaGuard

log = logging.getLogger(__name__)

MAX_COALESCED_CHARS = 8192
# Journal writes of different runs go to the database side by side, each thread on its own
# connection: on asgiref's one shared thread every run's round trips queued behind the
# others'. One run's flushes stay in order under its writer's lock.
DB_THREADS = 4


def db_thread_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=DB_THREADS, thread_name_prefix="journal-writer")


# A module global the tests replace to close its threads' connections (tests/support/runner.py).
db_threads = db_thread_pool()


def in_db_thread[**P, R](func: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """`func` as a coroutine function run in one of the writer's database threads."""
    return sync_to_async(func, thread_sensitive=False, executor=db_threads)


def changes_sidebar(batch: Sequence[NewEvent]) -> bool:
    return any(event.type in SIDEBAR_EVENTS for event in batch)


async def ring_owners(session_ids: set[int]) -> None:
    """After commit: the sessions' owners' sockets read their sessions' states again."""
    # Known owners (every session after its first ring) cost no thread hop.
    owners = notify.cached_owners(session_ids)
    if owners is None:
        try:
            owners = await in_db_thread(notify.session_owners)(session_ids)
        except (OperationalError, InterfaceError):
            # A doorbell, not the truth: the next ring or the web's poll brings the state.
            log.warning("sessions %s: the owners' doorbell was not rung", sorted(session_ids), exc_info=True)
            return
    await notify.apublish_user_sessions_changed(owners)


_rings: set[asyncio.Task[None]] = set()  # held: the loop keeps only a weak reference


def ring_owners_soon(session_ids: set[int]) -> None:
    """ring_owners in a task: the journal's writes and the run's next flush do not wait for it.

    The ring only makes the owners' sockets read the states again, after a commit that has
    happened; its order against the journal's notifications does not matter. Awaited, it held
    the run's writer lock, so a turn's first token waited behind run.started's ring.
    """
    task = asyncio.get_running_loop().create_task(ring_owners(session_ids))
    _rings.add(task)
    task.add_done_callback(_rings.discard)


class Written(NamedTuple):
    """A journal write's answer."""

    rows: list[JournalEvent]  # as written, with their seqs
    session_id: int
    to_publish: bool  # committed here, and its notifications are not sent yet: the caller sends them
    sent: asyncio.Future[None] | None = None  # handed to the Publisher: done once it has left


def run_events(run_id: int, written: Written) -> RunEvents:
    return written.session_id, run_id, journal.envelopes(written.rows, written.session_id)


class JournalWriter:
    """One run's journal writes, in the order its events arrived."""

    def __init__(self, run_id: int, window_ms: float | None = None, *, last_seq: int | None = None) -> None:
        self.run_id = run_id
        # The run's last seq this writer knows is committed: the claim's, then each write's.
        # Known, it makes a write the database did not answer exactly once; None (a writer not
        # told where the run's journal stood) gives such a write up at once.
        self.last_seq = last_seq
        self.window = (settings.HERMESWEB_COALESCE_MS if window_ms is None else window_ms) / 1000.0
        self.buffer = Coalescer(MAX_COALESCED_CHARS)
        # Deltas cut back where a secret could run on into the next one (docs/security.md).
        self.guard = DeltaGuard()
        self._lock = asyncio.Lock()
        self._timer: asyncio.TimerHandle | None = None
        self._pending: set[asyncio.Task[Any]] = set()
        self._flush_queued = False  # a flush task exists that has not taken the buffer yet
        self._last_take = -float("inf")  # loop time deltas were last taken for writing
        # The notification of the run's last write, until it has left: the end of the turn
        # publishes from another thread (turns.finish_run), so it waits for this one first.
        self._last_sent: asyncio.Future[None] | None = None
        self.closed = False
        # Told when a flush nobody awaits failed on its connection for good: its events may be
        # missing, so the run must not go on as if they were written.
        self.on_lost: Callable[[BaseException], None] | None = None

    def add(self, events: Sequence[NewEvent]) -> None:
        """Buffer events; schedules the flush. Never blocks the agent's reader."""
        if self.closed:
            return
        urgent = self.buffer.add(self.guard.feed(events))
        if urgent or self.buffer.delta_chars >= MAX_COALESCED_CHARS or self.window == 0:
            self._schedule(0)
        elif self._timer is None and self.buffer.events and not self._flush_queued:
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
        task = asyncio.get_running_loop().create_task(self._queued_flush())
        self._pending.add(task)
        task.add_done_callback(self._flush_done)

    async def _queued_flush(self) -> None:
        # Another flush may have taken this one's events meanwhile (an awaited flush, a final
        # write): then it must not take later deltas before their window.
        if self._flush_queued:
            await self.flush()

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
            if extra:  # events that follow the tail a delta stream holds back
                self.buffer.add(self.guard.release())
            batch = self._take() + list(extra)
            rows = await self._write(batch, also, run_updates) if batch else []
            sent = self._last_sent
        # Out of the lock, so the run's next batch commits meanwhile; a flush still returns once
        # the run's notifications so far have left (one Publisher, in order: the last one's).
        if sent is not None:
            await asyncio.shield(sent)
        return rows

    async def _write(
        self, batch: list[NewEvent], also: Callable[[], None] | None, run_updates: dict[str, Any]
    ) -> list[JournalEvent]:
        if also is None and not run_updates and not any(event.terminal for event in batch):

            def write() -> Awaitable[Written]:
                return group_commit().write(self.run_id, batch)
        else:

            def write() -> Awaitable[Written]:
                return in_db_thread(write_alone)(self.run_id, batch, also, run_updates)

        written = await self._write_exactly_once(batch, write)
        self._announce(written, bool(run_updates) or changes_sidebar(batch))
        return written.rows

    def _announce(self, written: Written, sidebar: bool) -> None:
        """A committed write's notification to the loop's Publisher, under the run's lock: a group's
        was handed over by the group (`sent`), a write of its own or one found landed is here."""
        if written.to_publish and written.rows:
            self._last_sent = group_commit().publisher.put(
                [run_events(self.run_id, written)], to_journal=False
            )
            if sidebar:
                ring_owners_soon({written.session_id})
        elif written.sent is not None:
            self._last_sent = written.sent

    def _take(self) -> list[NewEvent]:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._flush_queued = False
        # The window paces deltas: a take of other events alone (run.started, say) does not
        # hold back the delta after it, which may be the turn's first token.
        if self.buffer.has_deltas:
            self._last_take = asyncio.get_running_loop().time()
        return self.buffer.take()

    async def finish(self, final: Sequence[NewEvent], **run_updates: Any) -> list[JournalEvent]:
        """Write the buffer and the final events (ending with `done`) and hand the session on."""
        async with self._lock:
            self.closed = True
            self.buffer.add(self.guard.release())
            batch = self._take() + list(final)
            if self._last_sent is not None:  # the Publisher sends in order: all earlier ones have left
                await asyncio.shield(self._last_sent)
            finish_run = sync_to_async(revived(turns.finish_run))

            async def write() -> Written:
                # Its transaction publishes on commit.
                return Written(await finish_run(self.run_id, batch, **run_updates), 0, False)

            written = await self._write_exactly_once(batch, write)
            if written.to_publish:  # it landed unanswered: its commit's notifications never left
                self._announce(written, sidebar=False)
                if self._last_sent is not None:
                    await asyncio.shield(self._last_sent)
                await sync_to_async(turns.after_unanswered_finish)(self.run_id, written.session_id)
            return written.rows

    async def _write_exactly_once(
        self, batch: list[NewEvent], write: Callable[[], Awaitable[Written]]
    ) -> Written:
        """`write()` the batch exactly once, through a lost connection or a database that is down.

        A write that fails on its connection (the server restarted, failed over, or dropped
        the connection under the statement) may have committed without the answer reaching
        us. The run's rows after `last_seq` say which: nothing there, it did not land and is
        written again; exactly this batch, it landed (and is for us to publish); anything
        else, someone else wrote the run (a reaper, so the lease is gone) and the error
        stands. Tried until HERMESWEB_DB_RETRY_SECONDS have passed, then the error stands
        and the run fails (execution.JOURNAL_LOST); the agent streams on into the buffer
        meanwhile.
        """
        retrying: Retrying | None = None  # made at the first failure: nothing on the common path
        while True:
            try:
                written = await write()
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
                written = Written(landed.rows, landed.session_id, True)
            if self.last_seq is not None and written.rows:
                self.last_seq = written.rows[-1].seq
            return written

    async def _read_back(
        self, batch: list[NewEvent], error: Exception, retrying: Retrying
    ) -> journal.Appended | None:
        """The run's rows after `last_seq` if they are `batch`; None if there are none."""
        assert self.last_seq is not None
        read = in_db_thread(revived(journal.written_after))
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
            return journal.Appended(rows, session_id)
        if rows[-1].terminal:
            raise journal.AlreadyTerminal(f"run {self.run_id} ended while its write went unanswered")
        raise error


# ------------------------------------------------------------------ in a database thread

Items = Sequence[tuple[int, Sequence[NewEvent]]]  # (run id, its batch) for several runs


def write_alone(
    run_id: int,
    batch: Sequence[NewEvent],
    also: Callable[[], None] | None = None,
    run_updates: dict[str, Any] | None = None,
) -> Written:
    """One run's batch in a transaction of its own, with `also` and the run's updates: a flush that
    records a control, updates the run or ends it, and each batch of a refused group."""
    revive()
    updates = run_updates or {}
    if transaction.get_connection().in_atomic_block:
        # Someone's outer transaction decides when this commits: publish on that commit.
        with transaction.atomic():
            rows = journal.append_batch(run_id, batch, **updates)
            if also is not None:
                also()
        return Written(rows, 0, False)
    with transaction.atomic():
        appended = journal.append_unpublished(run_id, batch, **updates)
        if also is not None:
            also()
    return Written(appended.rows, appended.session_id, True)


def write_group(items: Items) -> list[Written | Exception]:
    """The batches of several runs in one transaction; per item its answer or its refusal.

    A group from a database thread: SQLite, and a loop without a connection of its own.
    A run that ended or vanished refuses its batch alone (journal.append_group_unpublished).
    Any other failure rolls the group back, and each batch is then written alone
    (`write_refused_group`); unless the connection was lost during the statement: whether the group
    committed is then unknown, each item answers the error, and each run's writer reads back.
    """
    revive()
    connection = transaction.get_connection()
    on_postgres = connection.vendor == "postgresql"
    if connection.in_atomic_block or (len(items) == 1 and not on_postgres):
        return write_refused_group(items)
    try:
        if on_postgres:
            # One statement that commits by itself: a group, even of one run, is one round
            # trip instead of three (UPDATE, INSERT, COMMIT).
            results = journal.append_group_unpublished(items)
        else:
            with transaction.atomic():
                results = journal.append_group_unpublished(items)
    except Exception as exc:
        raw = connection.connection
        if on_postgres and (raw is None or raw.closed):
            # revive() saw the connection open: it was lost mid-statement. (Refused on a
            # connection that stays up, the statement rolled back; SQLite's transaction surely
            # did: either is written again below.)
            log.warning("group commit of %d runs lost its connection", len(items), exc_info=True)
            return [exc] * len(items)
        log.warning("group commit of %d runs failed; writing them one by one", len(items), exc_info=True)
        return write_refused_group(items)
    return [_written(result) for result in results]


def write_refused_group(items: Items) -> list[Written | Exception]:
    """A group the database refused (or one a test's transaction holds), each run's batch in a
    transaction of its own: a batch refused costs only itself."""
    results: list[Written | Exception] = []
    for run_id, batch in items:
        try:
            results.append(write_alone(run_id, batch))
        except Exception as exc:
            results.append(exc)
    return results


def _written(result: journal.Appended | Exception) -> Written | Exception:
    return result if isinstance(result, Exception) else Written(result.rows, result.session_id, True)


# ------------------------------------------------------------------ on the event loop


class GroupCommit:
    """One event loop's plain journal writes, many runs to a transaction.

    While one group is in the database the next collects, so nothing waits when the runner
    is quiet and, under load, the commits per second stay near the number a database thread
    can do in a row, whatever the number of runs. The group's notifications go out together
    (notify.apublish_many), handed to the loop's Publisher as the group commits, while the
    next group is written. A run never has two batches in one group: its writer's lock lets
    one flush at a time through.
    """

    def __init__(self) -> None:
        self._waiting: list[tuple[int, list[NewEvent], asyncio.Future[Written]]] = []
        self._writing = False
        self._task: asyncio.Task[None] | None = None  # held: the loop keeps only a weak reference
        # PostgreSQL, in a runner: groups go from this loop on a connection of its own rather
        # than through a database thread, two thread hops fewer on every first token.
        self.connection: LoopConnection | None = None
        self.publisher = Publisher()  # this loop's journal notifications, the groups' and the runs' own

    def write_from_loop(self) -> None:
        """Send the groups from this loop, as a runner does (PostgreSQL; SQLite keeps its thread)."""
        if self.connection is None and notify.runners_listen():
            self.connection = LoopConnection()

    async def close(self) -> None:
        await self.publisher.drain()
        connection, self.connection = self.connection, None
        if connection is not None:
            await connection.discard()

    async def write(self, run_id: int, batch: list[NewEvent]) -> Written:
        """Write `batch` in the next group; its notification handed to the Publisher (`sent`)."""
        future: asyncio.Future[Written] = asyncio.get_running_loop().create_future()
        self._waiting.append((run_id, batch, future))
        if not self._writing:
            self._writing = True
            self._task = asyncio.get_running_loop().create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._waiting:
                group, self._waiting = self._waiting, []
                try:
                    results = await self.commit([(run_id, batch) for run_id, batch, _ in group])
                except BaseException as exc:  # both answer per item: this is the executor's, or a cancel
                    for _, _, future in group:
                        if not future.done():
                            future.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                    continue
                # Handed over here, together, before any flush returns: a run's next flush
                # waits for its writer's lock, so its notifications keep journal order.
                sent = self.publisher.put(
                    [
                        run_events(run_id, result)
                        for (run_id, _, _), result in zip(group, results, strict=True)
                        if not isinstance(result, BaseException) and result.to_publish and result.rows
                    ],
                    to_journal=True,
                )
                rung = {
                    result.session_id
                    for (_, batch, _), result in zip(group, results, strict=True)
                    if not isinstance(result, BaseException) and result.to_publish and changes_sidebar(batch)
                }
                if rung:
                    ring_owners_soon(rung)
                for (_, _, future), result in zip(group, results, strict=True):
                    if future.done():
                        continue  # its flush was cancelled; the rows are written all the same
                    if isinstance(result, BaseException):
                        future.set_exception(result)
                    else:
                        future.set_result(Written(result.rows, result.session_id, False, sent))
        finally:
            self._writing = False

    async def commit(self, items: Items) -> list[Written | Exception]:
        """One group: on this loop's connection if it has one, else in a database thread (`write_group`).

        Both answer alike: per item its `Written` or its refusal, a group refused on a live
        connection written again batch by batch.
        """
        if self.connection is None:
            return await in_db_thread(write_group)(items)
        return await self.commit_from_loop(self.connection, items)

    async def commit_from_loop(
        self, loop_connection: LoopConnection, items: Items
    ) -> list[Written | Exception]:
        """One group on this loop's own connection (a PostgreSQL runner): no thread hop each way."""
        conn = None
        try:
            conn = await loop_connection.get()
            results = await journal.aappend_group_unpublished(conn, items)
        except Exception as exc:
            if conn is not None and conn.closed:
                await loop_connection.discard()
                # Lost during the statement: whether the group committed is unknown, so it is
                # not written again here; each run's writer reads back to find out.
                log.warning("group commit of %d runs lost its connection", len(items), exc_info=True)
                lost = OperationalError(str(exc))
                lost.__cause__ = exc
                return [lost] * len(items)
            # Refused whole on a live connection (a lock timeout, a deadlock, a bad batch: in
            # autocommit the statement rolled back), or never sent.
            log.warning("group commit of %d runs failed; writing them one by one", len(items), exc_info=True)
            return await in_db_thread(write_refused_group)(items)
        return [_written(result) for result in results]


group_commit = per_event_loop(GroupCommit)  # this event loop's GroupCommit
