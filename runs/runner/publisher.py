"""The runner's journal notifications: sent after their commits, in commit order, by one task.

Design note: docs/live-delivery.md (the doorbell is at best at-least-once; viewers repair
gaps from the database). runs/runner/writer.py hands each committed write's notification here
and lets go of the run's lock, so a run's next batch commits while the one before is sent.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any, NamedTuple

from runs import notify

log = logging.getLogger(__name__)

RunEvents = tuple[int, int, list[dict[str, Any]]]  # session id, run id, envelopes: as notify takes them


class Publication(NamedTuple):
    batches: list[RunEvents]
    to_journal: bool  # a group commit's (the journal group), or one run's own write (its session's)
    sent: asyncio.Future[None]


class Publisher:
    """One event loop's journal notifications, sent after their commits, in commit order, by one task.

    A run's batches commit one at a time and are handed here as each commits, so one sender
    keeps every run's notifications in seq order while the run's next batch is already being
    committed. Journal-group notifications that queued up meanwhile leave as one message.
    """

    def __init__(self) -> None:
        self._queue: list[Publication] = []
        self._task: asyncio.Task[None] | None = None  # held: the loop keeps only a weak reference

    def put(self, batches: list[RunEvents], *, to_journal: bool) -> asyncio.Future[None]:
        """Send `batches` after everything put before; the future is done once they have left."""
        loop = asyncio.get_running_loop()
        sent: asyncio.Future[None] = loop.create_future()
        self._queue.append(Publication(batches, to_journal, sent))
        if self._task is None:
            self._task = loop.create_task(self._send_queued())
        return sent

    async def drain(self) -> None:
        while self._task is not None:  # until everything put has been sent (a runner stopping)
            await asyncio.shield(self._task)

    async def _send_queued(self) -> None:
        try:
            while self._queue:
                taken, self._queue = self._queue, []
                for to_journal, publications in itertools.groupby(taken, key=lambda p: p.to_journal):
                    await self._send(list(publications), to_journal)
        finally:
            self._task = None

    @staticmethod
    async def _send(publications: list[Publication], to_journal: bool) -> None:
        batches = [batch for publication in publications for batch in publication.batches]
        try:
            if to_journal:
                await notify.apublish_many(batches)
            else:
                for batch in batches:
                    await notify.apublish_events(*batch)
        except Exception:  # a doorbell: the web's poll repairs what it misses, the next ones still go
            log.warning("journal notifications were not sent", exc_info=True)
        finally:
            for publication in publications:
                if not publication.sent.done():
                    publication.sent.set_result(None)
