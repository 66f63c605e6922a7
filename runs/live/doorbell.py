"""Whether this process's doorbell (the channel layer) works now, and the feeds' timing knobs.

Design note: docs/live-delivery.md ("The feed", "During a Redis outage"). With Redis the feeds
poll the database only as a repair net (2 s); while the layer is down that poll is the delivery,
so it runs at the embedded rate (0.1 s) until the layer is back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from channels.layers import get_channel_layer
from django.conf import settings

from hermesweb.env import env_float
from runs import notify

# How often a web process with Redis asks the layer whether it works. channels_redis' pubsub
# layer never fails a `receive` (its reader task logs and retries), so a feed cannot tell an
# outage from a quiet session: a publish every half second can, for next to nothing.
LAYER_CHECK_SECONDS = 0.5


def tuning(name: str, default: float) -> float:
    """A timing knob: the Django setting if defined, else the environment variable of that name."""
    value = getattr(settings, name, None)
    if value is not None:
        return float(value)
    return env_float(name, default, minimum=0.001)


def poll_seconds(doorbell_crosses_processes: bool) -> float:
    if doorbell_crosses_processes:
        return tuning("HERMESWEB_LIVE_SAFETY_POLL_SECONDS", 2.0)
    # The InMemory layer cannot carry the runner's notifications: latency comes from this poll.
    return tuning("HERMESWEB_LIVE_POLL_SECONDS", 0.1)


def layer_down() -> bool:
    """The channel layer failed this process (a publish, or the check below) and is not back yet.

    `notify.health` learns of it back by its own probe; until then the feeds poll at the embedded rate.
    """
    return notify.health.down


async def watch_layer(on_down: Callable[[], None]) -> None:
    """Check the layer every LAYER_CHECK_SECONDS; call `on_down` when it goes down (not per check).

    It keeps checking while the layer is down, and tells `notify.health` as soon as it is back:
    the health's own probe backs off to 2 s, and this process's publishes wait on it.
    """
    was_down = layer_down()
    while True:
        await asyncio.sleep(LAYER_CHECK_SECONDS)
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            await notify.probe(layer)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not layer_down():
                notify.health.failed(notify.PROBE_GROUP, exc)
        else:
            notify.health.worked()
        down = layer_down()
        if down and not was_down:
            on_down()
        was_down = down
