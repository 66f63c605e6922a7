"""One object per running event loop: a process's hubs, quotas and group commits.

Keyed weakly by the loop, so a loop that ends (a test's, a thread's) takes its object with it and
the next loop makes its own: these objects hold tasks and futures bound to the loop that made them.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable


def per_event_loop[T](make: Callable[[], T]) -> Callable[[], T]:
    """A function answering the running loop's `make()`, made on its first call in that loop."""
    made: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, T] = weakref.WeakKeyDictionary()

    def this_loops() -> T:
        loop = asyncio.get_running_loop()
        found = made.get(loop)
        if found is None:
            found = made[loop] = make()
        return found

    return this_loops
