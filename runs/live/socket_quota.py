"""Open sockets per user, counted across every web process (docs/security.md, "Limits").

A socket that is admitted takes a row (`hermesweb.models.OpenSocket`) and gives it back when it
closes; past `HERMESWEB_MAX_SOCKETS_PER_USER` rows a new socket is closed with 4429. Rows live in
the database because a user's sockets spread over every web process behind the proxy. Each
process refreshes its rows' `seen_at` every REFRESH_SECONDS; the row of a process that died
stops counting STALE_SECONDS later, and is deleted by the next refresh of any process.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from hermesweb.models import OpenSocket
from projects.services import hold_owner
from runs.event_loops import per_event_loop
from runs.live.reads import pooled

log = logging.getLogger(__name__)

# This web process, as its rows name it.
PROCESS = uuid.uuid4().hex
REFRESH_SECONDS = 20.0
# Three missed refreshes: a process that stalls for a minute loses its count, not its sockets.
STALE_SECONDS = 3 * REFRESH_SECONDS
_CHUNK = 500  # under SQLite's bound on parameters


def claim(user_id: Any) -> int | None:
    """A row for a new socket of the user; None when the user holds the cap already (sync).

    The user's row lock makes the count and the insert it allows one step, so sockets opened at
    once in several processes cannot all pass the same count.
    """
    now = timezone.now()
    with transaction.atomic():
        hold_owner(user_id)
        held = OpenSocket.objects.filter(user_id=user_id, seen_at__gte=now - timedelta(seconds=STALE_SECONDS))
        if held.count() >= settings.HERMESWEB_MAX_SOCKETS_PER_USER:
            return None
        return OpenSocket.objects.create(user_id=user_id, process=PROCESS, opened_at=now, seen_at=now).pk


def release(socket_id: int) -> None:
    OpenSocket.objects.filter(pk=socket_id).delete()


def refresh(socket_ids: list[int]) -> None:
    """Mark this process's sockets seen, and delete every process's stale rows (sync)."""
    now = timezone.now()
    for start in range(0, len(socket_ids), _CHUNK):
        OpenSocket.objects.filter(pk__in=socket_ids[start : start + _CHUNK]).update(seen_at=now)
    OpenSocket.objects.filter(seen_at__lt=now - timedelta(seconds=STALE_SECONDS)).delete()


class Quota:
    """This event loop's admitted sockets' rows, refreshed together by one timer."""

    def __init__(self) -> None:
        self.rows: set[int] = set()
        self.task: asyncio.Task[None] | None = None

    def add(self, row: int) -> None:
        """A row `claim` took (in the admission's own thread hop) for a socket of this loop."""
        self.rows.add(row)
        if self.task is None:
            self.task = asyncio.ensure_future(self._refresh_loop())

    async def release(self, row: int) -> None:
        self.rows.discard(row)
        if not self.rows and self.task is not None:
            task, self.task = self.task, None
            task.cancel()
        try:
            await pooled(release)(row)
        except Exception:
            # The row stops counting once it goes stale.
            log.warning("could not release socket row %s; it expires by itself", row, exc_info=True)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_SECONDS)
            try:
                await pooled(refresh)(sorted(self.rows))
            except Exception:
                log.warning("refreshing this process's socket rows failed; trying again", exc_info=True)


get_quota = per_event_loop(Quota)  # this event loop's Quota
