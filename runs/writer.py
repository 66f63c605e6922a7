"""The run's journal writer: coalesce deltas, batch rows, keep order.

Token and reasoning deltas for the same segment merge for up to
HERMESWEB_COALESCE_MS (or until MAX_COALESCED_CHARS), so a fast model costs a
row per window, not per token. Any other event flushes what is buffered first,
in one transaction, so the journal order is exactly the arrival order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import transaction

from runs import journal, notify, services
from runs.journal import NewEvent
from runs.models import EventType, JournalEvent

DELTA_TYPES = {EventType.TOKEN_DELTA: "message_id", EventType.REASONING_DELTA: "reasoning_id"}
MAX_COALESCED_CHARS = 8192


class JournalWriter:
    def __init__(self, run_id: int, window_ms: float | None = None) -> None:
        self.run_id = run_id
        self.window = (settings.HERMESWEB_COALESCE_MS if window_ms is None else window_ms) / 1000.0
        self.buffer: list[NewEvent] = []
        self.buffered_chars = 0
        self._lock = asyncio.Lock()
        self._timer: asyncio.TimerHandle | None = None
        self._pending: set[asyncio.Task[Any]] = set()
        self.closed = False

    def add(self, events: Sequence[NewEvent]) -> None:
        """Buffer events; schedules the flush. Never blocks the agent's reader."""
        if self.closed:
            return
        urgent = False
        for event in events:
            id_key = DELTA_TYPES.get(event.type)
            last = self.buffer[-1] if self.buffer else None
            if (
                id_key
                and last is not None
                and last.type == event.type
                and last.payload.get(id_key) == event.payload.get(id_key)
            ):
                last.payload["delta"] += event.payload["delta"]
            else:
                self.buffer.append(NewEvent(event.type, dict(event.payload)))
            if id_key:
                self.buffered_chars += len(event.payload.get("delta", ""))
            else:
                urgent = True
        if urgent or self.buffered_chars >= MAX_COALESCED_CHARS or self.window == 0:
            self._schedule(0)
        elif self._timer is None and self.buffer:
            self._timer = asyncio.get_running_loop().call_later(self.window, self._schedule, 0)

    def _schedule(self, _: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        task = asyncio.get_running_loop().create_task(self.flush())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

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
            rows, session_id = await sync_to_async(_append)(self.run_id, batch, also, run_updates)
            # Committed: publish from this loop, still under the lock so notifications keep
            # journal order. (Publishing on commit inside the database thread would park that
            # thread — which every run of this process shares — until the loop had sent it.)
            await notify.apublish_events(session_id, self.run_id, journal.envelopes(rows, session_id))
            return rows

    def _take(self) -> list[NewEvent]:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self.buffer, self.buffered_chars = self.buffer, [], 0
        return batch

    async def finish(self, final: Sequence[NewEvent], **run_updates: Any) -> list[JournalEvent]:
        """Write the buffer and the final events (ending with `done`) and hand the session on."""
        async with self._lock:
            self.closed = True
            batch = self._take() + list(final)
            return await sync_to_async(services.finish_run)(self.run_id, batch, **run_updates)


def _append(
    run_id: int, batch: list[NewEvent], also: Callable[[], None] | None, updates: dict[str, Any]
) -> tuple[list[JournalEvent], int]:
    if transaction.get_connection().in_atomic_block:
        raise RuntimeError("the writer publishes after its own commit: it must not run inside atomic()")
    with transaction.atomic():
        rows, session_id = journal.append_unpublished(run_id, batch, **updates)
        if also is not None:
            also()
    return rows, session_id
