"""Sessions' owners, cached per process, so ringing an owner's sidebar costs no query on a turn's path.

A session's owner changes only in the admin (its project given to another user, or the session
moved to another project), so each process looks it up once. A change drops the cache in every
process (projects.signals → forget_owners: this one at once, the others through OWNERS_GROUP);
a drop lost with the doorbell (a Redis outage) lasts at most OWNERS_TTL_SECONDS.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings

from runs.notify.groups import OWNERS_GROUP
from runs.notify.layer_health import PROBE_PAUSE_SECONDS
from runs.notify.sending import send, thread_publisher

log = logging.getLogger(__name__)

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
        send(OWNERS_GROUP, {"type": "owners.changed"})


def hear_owner_changes() -> None:
    """Subscribe this process to owner changes, once (on the publisher's loop, as its sends)."""
    with _hearing_lock:
        if owner_cache.hearing or owner_cache.listener is not None:
            return
        if not settings.REDIS_URL:
            owner_cache.hearing = True
            return
        loop, _ = thread_publisher.start()
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
