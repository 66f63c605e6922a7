"""The `sessions` frames: every socket of a user follows the live state of all their sessions.

Design note: docs/live-delivery.md ("The user's sessions"). One `UserFeed` per watching user
per web process, and one channel per process for all of them (no channel per socket). The
doorbell `notify.user_sessions_group` is rung after commit by whatever changes a session's
live state; a ring makes the feed read every session's state again (one query,
`user_states.read_states`) and send each of the user's sockets what changed. Without Redis the
runner's rings cannot reach this process, so the feeds poll: a bounded poll, the embedded mode
(and a Redis outage) only; with Redis the poll is a slow repair net for a lost doorbell.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings

from runs import notify
from runs.event_loops import per_event_loop
from runs.live.doorbell import layer_down, tuning
from runs.live.user_doorbell import UserDoorbell
from runs.live.user_states import SessionState, changes, delta_frame, read_states, snapshot_frame

log = logging.getLogger(__name__)

Send = Callable[[str], Awaitable[None]]

# One read for the rings of a turn's start (the submit's, then run.started's a few ms later),
# taken after the runner's claim and first token rather than beside them, on the same database.
RING_COALESCE_SECONDS = 0.025


def poll_seconds() -> float:
    if settings.REDIS_URL and not layer_down():
        # The doorbell crosses processes: the poll only repairs a lost ring.
        return tuning("HERMESWEB_LIVE_USER_SAFETY_POLL_SECONDS", 10.0)
    # The InMemory layer cannot carry the runner's rings: this poll is the live path.
    return tuning("HERMESWEB_LIVE_USER_POLL_SECONDS", 0.5)


class UserFeed:
    """One user's sessions as this process last read them, and the user's sockets here."""

    def __init__(self, user_id: Any) -> None:
        self.user_id = user_id
        self.sockets: set[Send] = set()
        self.states: dict[int, SessionState] | None = None
        self.lock = asyncio.Lock()  # one read at a time: a slower read never overwrites a newer one
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def ring(self) -> None:
        self.wake.set()

    async def join(self, send: Send) -> None:
        self.sockets.add(send)
        if self.task is None:
            self.task = asyncio.ensure_future(self._loop())
        await self.refresh(joining=send)

    def leave(self, send: Send) -> None:
        self.sockets.discard(send)
        if not self.sockets and self.task is not None:
            self.task.cancel()
            self.task = None

    async def _loop(self) -> None:
        while True:
            await self.wake.wait()
            await asyncio.sleep(RING_COALESCE_SECONDS)
            self.wake.clear()  # rings during the read below make one more read, not one each
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("user %s: reading the sessions' states failed", self.user_id, exc_info=True)
                await asyncio.sleep(1.0)
                self.wake.set()

    async def refresh(self, joining: Send | None = None) -> None:
        """Read the states; send the others what changed, and `joining` the whole snapshot."""
        async with self.lock:
            states = await database_sync_to_async(read_states)(self.user_id)
            old, self.states = self.states, states
            if old is not None:
                found = changes(old, states)
                if found.changed or found.removed:
                    frame = delta_frame(found)
                    # `!=`, not `is not`: a socket's bound method is a new object each time, but equal.
                    for send in [s for s in self.sockets if s != joining]:
                        await _send(send, frame)
            if joining is not None and joining in self.sockets:
                await _send(joining, snapshot_frame(states.values()))


async def _send(send: Send, frame: str) -> None:
    # A socket closing as this is sent leaves on its own (disconnect); the others still get it.
    with contextlib.suppress(Exception):
        await send(frame)


class UserHub:
    """This event loop's user feeds, their one doorbell channel and their one poll."""

    def __init__(self) -> None:
        self.feeds: dict[Any, UserFeed] = {}
        self.doorbell = UserDoorbell(notify.user_sessions_group, self._rung, "sessions")
        self._poll_task: asyncio.Task[None] | None = None

    async def join(self, user_id: Any, send: Send) -> None:
        """Follow the user's sessions on this socket: a snapshot now, changes from then on."""
        feed = self.feeds.get(user_id)
        if feed is None:
            feed = self.feeds[user_id] = UserFeed(user_id)
            # In the group before the first read: whatever commits after that read rings here.
            await self.doorbell.join(user_id)
        if self._poll_task is None:
            self._poll_task = asyncio.ensure_future(self._poll())
        await feed.join(send)

    async def leave(self, user_id: Any, send: Send) -> None:
        feed = self.feeds.get(user_id)
        if feed is None:
            return
        feed.leave(send)
        if feed.sockets:
            return
        del self.feeds[user_id]
        await self.doorbell.leave(user_id)
        if not self.feeds:
            task, self._poll_task = self._poll_task, None
            if task is not None:
                task.cancel()
            self.doorbell.close()

    async def _rung(self, message: dict[str, Any]) -> None:
        feed = self.feeds.get(message.get("user_id"))
        if feed is not None:
            feed.ring()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(poll_seconds())
            for feed in list(self.feeds.values()):
                feed.ring()


get_user_hub = per_event_loop(UserHub)  # this event loop's UserHub
