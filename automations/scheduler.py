"""The scheduler: every runner runs this loop; the database decides which one fires a time.

Each tick reads the enabled schedules that are due (one indexed query when none is) and
decides each planned time in a transaction of its own (services.do_fire_planned): the runner
that inserts the Firing row launches; the others find the time taken and move on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from asgiref.sync import sync_to_async

from automations import services

log = logging.getLogger(__name__)

# A planned time fires within this of its minute (plus the time a launch takes).
TICK_SECONDS = 1.0


def identity(fn: Callable[..., Any]) -> Callable[..., Any]:
    return fn


async def run(stopping: asyncio.Event, runner_id: str, wrap: Callable[..., Any] = identity) -> None:
    """Fire due schedules every TICK_SECONDS until `stopping` is set.

    `wrap` wraps the database work (the runner passes connections.revived, so a connection the
    server closed is replaced first). A failing tick is logged once per outage, then quietly.
    """
    tick = sync_to_async(wrap(services.tick))
    failing = False
    while not stopping.is_set():
        try:
            fired = await tick(fired_by=runner_id)
            for firing in fired:
                log.info("trigger %s at %s: %s", firing.trigger_id, firing.planned_at, firing.outcome)
            if failing:
                log.warning("the scheduler works again")
            failing = False
        except Exception:
            if not failing:
                log.warning("the scheduler failed; trying again quietly until it works", exc_info=True)
            failing = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), TICK_SECONDS)
