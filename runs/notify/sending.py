"""Ringing from synchronous code: after a commit, handed to one thread's event loop, not awaited.

`publish_on_commit` is the one way a write rings (Zulip's `send_event_on_commit`): the
doorbell goes out once the transaction that wrote the work commits, and never for a rollback.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction

from runs.notify.layer_health import asend

log = logging.getLogger(__name__)


def publish_on_commit[**P](publish: Callable[P, object], *args: P.args, **kwargs: P.kwargs) -> None:
    """`publish(*args, **kwargs)` once the current transaction commits (at once outside one)."""
    transaction.on_commit(partial(publish, *args, **kwargs))


def send(group: str, message: dict[str, Any]) -> None:
    """Ring from synchronous code (after a commit): handed to the publisher, not awaited."""
    if settings.REDIS_URL:
        thread_publisher.submit(group, message)
        return
    # The in-memory layer only reaches this process's own loop; it is never a doorbell
    # between processes (consumers and runners poll the database without Redis).
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, message)
    except Exception:  # the doorbell failing must never fail the write that rang it
        log.warning("channel layer publish to %s failed", group, exc_info=True)


class ThreadPublisher:
    """One thread, one event loop, one Redis connection: sends what synchronous code publishes.

    `async_to_sync(group_send)` would make a request wait for Redis, and in a thread without
    a loop open a connection each time; here the caller only enqueues. One queue, sent in
    order: notifications keep the order their commits had. The doorbell may still be lost
    (a crash before the send) — nothing relies on it for correctness.
    """

    DRAIN_AT_EXIT_SECONDS = 2.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[tuple[str, dict[str, Any]]] | None = None
        self._thread: threading.Thread | None = None

    def submit(self, group: str, message: dict[str, Any]) -> None:
        loop, queue = self.start()
        loop.call_soon_threadsafe(queue.put_nowait, (group, message))

    def start(self) -> tuple[asyncio.AbstractEventLoop, asyncio.Queue[Any]]:
        """The thread's loop and queue, the thread started first if it is not running."""
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                ready = threading.Event()
                self._thread = threading.Thread(
                    target=self._run, args=(ready,), name="hermesweb-notify", daemon=True
                )
                self._thread.start()
                ready.wait()
            assert self._loop is not None and self._queue is not None
            return self._loop, self._queue

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop, self._queue = loop, asyncio.Queue()
        ready.set()
        loop.run_until_complete(self._pump(self._queue))

    @staticmethod
    async def _pump(queue: asyncio.Queue[tuple[str, dict[str, Any]]]) -> None:
        while True:
            await asend(*await queue.get())
            queue.task_done()

    def drain(self, timeout: float = DRAIN_AT_EXIT_SECONDS) -> None:
        """Send what is queued (a management command is about to exit), waiting at most `timeout`."""
        with self._lock:
            loop, queue = self._loop, self._queue
            if loop is None or queue is None or self._thread is None or not self._thread.is_alive():
                return
        done = asyncio.run_coroutine_threadsafe(queue.join(), loop)
        try:
            done.result(timeout)
        except Exception:
            log.warning("%d notifications were not sent before exit", queue.qsize())


thread_publisher = ThreadPublisher()
atexit.register(thread_publisher.drain)
