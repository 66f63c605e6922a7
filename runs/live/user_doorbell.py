"""One channel per web process for one kind of per-user doorbell (design: docs/live-delivery.md).

The sign-in watch (`signins`) and the sessions' states (`user_feed`) each follow the users with
an open socket here: the process's channel joins `group_name(user_id)` while the user has one,
and every message that arrives is handed to `on_ring`. No channel per socket or per user.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

Ring = Callable[[dict[str, Any]], Awaitable[None]]


class UserDoorbell:
    def __init__(self, group_name: Callable[[Any], str], on_ring: Ring, what: str) -> None:
        self.group_name = group_name
        self.on_ring = on_ring
        self.what = what  # for the log: "sign-in", "sessions"
        self.channel: str | None = None
        self._listener: asyncio.Task[None] | None = None
        self._joining = asyncio.Lock()

    async def join(self, user_id: Any) -> None:
        """Ring for this user from now on (call when the user's first socket here arrives)."""
        await self._group("group_add", user_id)

    async def leave(self, user_id: Any) -> None:
        """No more rings for this user (call when the user's last socket here left)."""
        await self._group("group_discard", user_id)

    def close(self) -> None:
        """Stop listening and forget the channel: no user is followed here any more."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
        self.channel = None

    async def _group(self, action: str, user_id: Any) -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            async with self._joining:
                if self.channel is None:
                    self.channel = await layer.new_channel()
                if self._listener is None:
                    self._listener = asyncio.ensure_future(self._listen(layer, self.channel))
                await getattr(layer, action)(self.group_name(user_id), self.channel)
        except Exception:
            # Both users of this doorbell also re-read on a timer: a lost join costs seconds.
            log.warning("%s doorbell for user %s: layer unavailable", self.what, user_id, exc_info=True)

    async def _listen(self, layer: Any, channel: str) -> None:
        while True:
            try:
                message = await layer.receive(channel)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("%s doorbell: receive failed", self.what, exc_info=True)
                await asyncio.sleep(1.0)
                continue
            try:
                await self.on_ring(message)
            except Exception:
                log.warning("%s doorbell: a ring failed", self.what, exc_info=True)
