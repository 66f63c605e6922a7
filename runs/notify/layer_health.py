"""The channel layer as this process's publishes find it, and the one awaited send.

A doorbell is best effort: a publish waits at most PUBLISH_TIMEOUT_SECONDS, and once one fails,
publishes are skipped (a hung Redis must not hold up the journal writes that await them) until a
probe in the background finds the layer back; meanwhile consumers and runners poll the database.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from channels.layers import BaseChannelLayer, get_channel_layer

from runs.notify.groups import PROBE_GROUP

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT_SECONDS = 1.0
PROBE_PAUSE_SECONDS = (0.5, 2.0)


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
                await probe(layer)
            except Exception:
                pause = min(pause * 2, PROBE_PAUSE_SECONDS[1])
                continue
            self.worked()


health = ChannelLayerHealth()


async def probe(layer: BaseChannelLayer) -> None:
    """One publish to the probe group, at most PUBLISH_TIMEOUT_SECONDS: raises if the layer is down."""
    await asyncio.wait_for(layer.group_send(PROBE_GROUP, {"type": "probe"}), PUBLISH_TIMEOUT_SECONDS)


async def asend(group: str, message: dict[str, Any]) -> None:
    """Publish from a coroutine, at most PUBLISH_TIMEOUT_SECONDS, skipped while the layer is down."""
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
