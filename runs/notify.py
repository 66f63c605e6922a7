"""The doorbells: channel-layer notifications sent after commit, and the runners' one.

Delivery is at-least-once at best (at-most-once by Channels' own spec), so
nothing relies on it for correctness: consumers repair seq gaps from the
database and the runner re-reads pending controls on a timer.

On PostgreSQL the runners' doorbell is the database's own LISTEN/NOTIFY
(docs/runner.md, "Waking"): the notification is part of the transaction that
wrote the work, so it goes out at that commit and never for a rollback.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import logging
import threading
import time
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection, transaction

log = logging.getLogger(__name__)

RUNNERS_GROUP = "runners"
# PostgreSQL: the channel runners LISTEN on (runs.runner.process); payload "reason[:run id]".
RUNNERS_CHANNEL = "hermesweb_runners"
# Runners' journal notifications for every session (apublish_many); web processes listen once.
JOURNAL_GROUP = "journal"
# Events ride along in the notification while small, so N sockets of one web
# process do not each query the database; larger batches send only the cursor.
INLINE_EVENTS_MAX = 200


def session_group(session_id: int) -> str:
    return f"session.{session_id}"


def user_group(user_id: Any) -> str:
    """A user's sign-in doorbell: each web process listens for the users its sockets serve."""
    return f"user.{user_id}"


def user_sessions_group(user_id: Any) -> str:
    """A user's sessions doorbell: any of their sessions changed its live state (runs.live.user_feed)."""
    return f"user.{user_id}.sessions"


def publish_user_sessions_changed(user_id: Any) -> None:
    """After commit: the owner's sockets read all their sessions' states again."""
    _send(user_sessions_group(user_id), {"type": "user.sessions", "user_id": user_id})


async def apublish_user_sessions_changed(user_ids: set[Any]) -> None:
    for user_id in user_ids:
        await _asend(user_sessions_group(user_id), {"type": "user.sessions", "user_id": user_id})


# A session's owner changes only in the admin (its project given to another user, or the session
# moved to another project), so each process looks it up once: ringing a known owner costs no
# query on a turn's path. A change drops the cache in every process (projects.signals →
# forget_owners: this one at once, the others through OWNERS_GROUP); a drop lost with the
# doorbell (a Redis outage) lasts at most OWNERS_TTL_SECONDS.
OWNERS_GROUP = "owners"
OWNERS_CACHED_MAX = 10_000
OWNERS_TTL_SECONDS = 300.0


class OwnerCache:
    """Sessions' owners as this process last read them, trusted only while it hears changes."""

    def __init__(self) -> None:
        self.owners: dict[int, Any] = {}
        self.generation = 0  # bumped by each drop: a read that began before it is not kept
        self.since = time.monotonic()
        self.hearing = False  # subscribed to OWNERS_GROUP (always, without Redis: no other process rings)
        self.listener: concurrent.futures.Future[None] | None = None

    def known(self, session_ids: set[int]) -> set[Any] | None:
        if not self.hearing or time.monotonic() - self.since > OWNERS_TTL_SECONDS:
            return None
        owners = self.owners
        try:
            return {owners[pk] for pk in session_ids}
        except KeyError:
            return None

    def remember(self, rows: list[tuple[int, Any]], generation: int) -> None:
        """Rows read since `generation`: kept unless a drop came in meanwhile."""
        if generation != self.generation:
            return
        if len(self.owners) > OWNERS_CACHED_MAX or time.monotonic() - self.since > OWNERS_TTL_SECONDS:
            self.drop()
        self.owners.update(rows)

    def drop(self) -> None:
        # A new dict, not clear(): readers in other threads see the old one or the new one.
        self.owners, self.since = {}, time.monotonic()
        self.generation += 1


owner_cache = OwnerCache()
_hearing_lock = threading.Lock()


def cached_owners(session_ids: set[int]) -> set[Any] | None:
    """The owners of these sessions if this process knows them all, else None (no query)."""
    return owner_cache.known(session_ids)


def session_owners(session_ids: set[int]) -> set[Any]:
    """The owners of these sessions (sync); a session deleted meanwhile has none."""
    from projects.models import Session  # runs.notify is imported by the models' own modules

    hear_owner_changes()
    known = owner_cache.known(session_ids)
    if known is not None:
        return known
    generation = owner_cache.generation
    rows = list(Session.objects.filter(pk__in=session_ids).values_list("pk", "project__owner_id"))
    owner_cache.remember(rows, generation)
    return {owner for _, owner in rows}


def remember_owner(session_id: int, owner_id: Any) -> None:
    """The caller read this owner in its transaction: it spares the next ring a query."""
    owner_cache.remember([(session_id, owner_id)], owner_cache.generation)


def forget_owners() -> None:
    """After commit of an owner change: every process reads its sessions' owners again."""
    owner_cache.drop()
    if settings.REDIS_URL:
        _send(OWNERS_GROUP, {"type": "owners.changed"})


def hear_owner_changes() -> None:
    """Subscribe this process to owner changes, once (on the publisher's loop, as its sends)."""
    with _hearing_lock:
        if owner_cache.hearing or owner_cache.listener is not None:
            return
        if not settings.REDIS_URL:
            owner_cache.hearing = True
            return
        loop, _ = _publisher._start()
        owner_cache.listener = asyncio.run_coroutine_threadsafe(_hear_owner_changes(), loop)


async def _hear_owner_changes() -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    while True:
        try:
            channel = await layer.new_channel()
            await layer.group_add(OWNERS_GROUP, channel)
            break
        except Exception:
            log.warning("channel layer: cannot hear owner changes yet", exc_info=True)
            await asyncio.sleep(PROBE_PAUSE_SECONDS[1])
    # What was read before the subscription may predate a change it missed.
    owner_cache.drop()
    owner_cache.hearing = True
    while True:
        try:
            await layer.receive(channel)
        except Exception:
            log.warning("channel layer: owner changes receive failed", exc_info=True)
            await asyncio.sleep(PROBE_PAUSE_SECONDS[1])
        owner_cache.drop()  # a change, or a failed receive that may have lost one


def publish_sign_in_changed(user_id: Any, session_tag: str | None = None) -> None:
    """After commit: `session_tag` (runs.live.signins.session_tag) signed out, or, without one,
    the user's password, activity or staff flag changed: their sockets check again."""
    _send(user_group(user_id), {"type": "signin.changed", "user_id": user_id, "session_tag": session_tag})


def run_events_message(session_id: int, run_id: int, envelopes: list[dict[str, Any]]) -> dict[str, Any]:
    last_seq = envelopes[-1]["seq"] if envelopes else 0
    message: dict[str, Any] = {
        "type": "run.events",
        "session_id": session_id,
        "run_id": run_id,
        "last_seq": last_seq,
    }
    if len(envelopes) <= INLINE_EVENTS_MAX:
        message["events"] = envelopes
    return message


def _send(group: str, message: dict[str, Any]) -> None:
    """Ring from synchronous code (after a commit): handed to the publisher, not awaited."""
    if settings.REDIS_URL:
        _publisher.submit(group, message)
        return
    # The in-memory layer only reaches this process's own loop; it is never a doorbell
    # between processes (consumers and runners poll the database without Redis).
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, message)
    except Exception:  # the doorbell failing must never fail the write that rang it
        log.warning("channel layer publish to %s failed", group, exc_info=True)


class Publisher:
    """One thread, one event loop, one Redis connection: sends what synchronous code publishes.

    `async_to_sync(group_send)` would make a request wait for Redis, and in a thread without
    a loop open a connection each time; here the caller only enqueues. One queue, sent in
    order: notifications keep the order their commits had. The doorbell may still be lost
    (a crash before the send) — nothing relies on it for correctness.
    """

    DRAIN_AT_EXIT_SECONDS = 2.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[tuple[str, dict[str, Any]]] | None = None
        self._thread: threading.Thread | None = None

    def submit(self, group: str, message: dict[str, Any]) -> None:
        loop, queue = self._start()
        loop.call_soon_threadsafe(queue.put_nowait, (group, message))

    def _start(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Queue[Any]]:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                ready = threading.Event()
                self._thread = threading.Thread(
                    target=self._run, args=(ready,), name="hermesweb-notify", daemon=True
                )
                self._thread.start()
                ready.wait()
            assert self._loop is not None and self._queue is not None
            return self._loop, self._queue

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop, self._queue = loop, asyncio.Queue()
        ready.set()
        loop.run_until_complete(self._pump(self._queue))

    @staticmethod
    async def _pump(queue: asyncio.Queue[tuple[str, dict[str, Any]]]) -> None:
        while True:
            await _asend(*await queue.get())
            queue.task_done()

    def drain(self, timeout: float = DRAIN_AT_EXIT_SECONDS) -> None:
        """Send what is queued (a management command is about to exit), waiting at most `timeout`."""
        with self._lock:
            loop, queue = self._loop, self._queue
            if loop is None or queue is None or self._thread is None or not self._thread.is_alive():
                return
        done = asyncio.run_coroutine_threadsafe(queue.join(), loop)
        try:
            done.result(timeout)
        except Exception:
            log.warning("%d notifications were not sent before exit", queue.qsize())


_publisher = Publisher()
atexit.register(_publisher.drain)


# A doorbell is best effort: a publish waits at most this long, and once one fails, publishes
# are skipped — a hung Redis must not hold up the journal writes that await them — until a
# probe in the background finds the layer back; meanwhile consumers and runners poll the database.
PUBLISH_TIMEOUT_SECONDS = 1.0
PROBE_PAUSE_SECONDS = (0.5, 2.0)
PROBE_GROUP = "hermesweb.probe"


class ChannelLayerHealth:
    """The channel layer as this process's publishes find it; an outage is logged once each way."""

    def __init__(self) -> None:
        self.down_since: float | None = None
        self.skipped = 0
        self._probe: asyncio.Task[None] | None = None

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def failed(self, group: str, exc: BaseException) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()
            log.warning(
                "channel layer publish to %s failed (%r); the database is polled meanwhile", group, exc
            )
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._until_back())

    def worked(self) -> None:
        if self.down_since is not None:
            took = time.monotonic() - self.down_since
            log.warning("channel layer is back after %.1f s (%d notifications skipped)", took, self.skipped)
            self.down_since, self.skipped = None, 0

    async def _until_back(self) -> None:
        pause = PROBE_PAUSE_SECONDS[0]
        while self.down:
            await asyncio.sleep(pause)
            layer = get_channel_layer()
            if layer is None:
                return
            try:
                await asyncio.wait_for(
                    layer.group_send(PROBE_GROUP, {"type": "probe"}), PUBLISH_TIMEOUT_SECONDS
                )
            except Exception:
                pause = min(pause * 2, PROBE_PAUSE_SECONDS[1])
                continue
            self.worked()


health = ChannelLayerHealth()


async def _asend(group: str, message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    if health.down:
        health.skipped += 1
        return
    for attempt in (1, 2):
        try:
            await asyncio.wait_for(layer.group_send(group, message), PUBLISH_TIMEOUT_SECONDS)
        except TimeoutError as exc:
            health.failed(group, exc)
            return
        except Exception as exc:
            # Once more: the first publish after Redis returns may meet a connection it closed.
            if attempt == 2:
                health.failed(group, exc)
            continue
        return


def publish_events(session_id: int, run_id: int, envelopes: list[dict[str, Any]]) -> None:
    _send(session_group(session_id), run_events_message(session_id, run_id, envelopes))


async def apublish_events(session_id: int, run_id: int, envelopes: list[dict[str, Any]]) -> None:
    await _asend(session_group(session_id), run_events_message(session_id, run_id, envelopes))


async def apublish_many(batches: list[tuple[int, int, list[dict[str, Any]]]]) -> None:
    """Several runs' notifications (session id, run id, envelopes) as one message.

    To JOURNAL_GROUP, which each web process listens to once (runs.live.feed.LiveHub): a runner
    holding a hundred runs commits them in groups, and one message per group instead of
    one per run per flush spares both sides thousands of Redis round trips and parses a
    second.
    """
    if batches:
        runs = [run_events_message(s, r, e) for s, r, e in batches]
        await _asend(JOURNAL_GROUP, {"type": "journal.events", "runs": runs})


def publish_session_changed(session_id: int, owner_id: Any = None) -> None:
    """After commit: the session's viewers read its snapshot again, and its owner's sidebar states.

    `owner_id`, when the caller knows it, spares the owner's lookup (a turn's one statement).
    """
    _send(session_group(session_id), {"type": "session.changed", "session_id": session_id})
    if owner_id is not None:
        remember_owner(session_id, owner_id)
    try:
        owners = session_owners({session_id})
    except Exception:  # the doorbell failing must never fail the write that rang it
        log.warning("session %s: its owner's doorbell was not rung", session_id, exc_info=True)
        return
    for owner in owners:
        publish_user_sessions_changed(owner)


def runners_listen() -> bool:
    """Whether runners wake on the database's notifications (else on the channel layer)."""
    return connection.vendor == "postgresql"


def wake_runners(reason: str, run_id: int | None = None) -> None:
    """Ring the runners for what the caller wrote: at its transaction's commit, or now.

    Called inside the transaction that wrote the work, never in on_commit: on PostgreSQL
    it is a NOTIFY that PostgreSQL delivers at that commit, and only if it commits, with no
    thread hop or round trip of its own on the way to the first token.
    """
    if runners_listen():
        # The payload is for whoever watches the channel (psql's LISTEN); runners only wake.
        payload = reason if run_id is None else f"{reason}:{run_id}"
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [RUNNERS_CHANNEL, payload])
        return
    message = {"type": "runner.wake", "reason": reason, "run_id": run_id}
    transaction.on_commit(lambda: _send(RUNNERS_GROUP, message))
