"""The ASGI handler for HTTP: one thread hop per request, on a thread kept between requests.

Django's ASGIHandler builds an async middleware chain. With synchronous middleware
and views (ours, by choice: see hermesweb/middleware.py) that chain crosses between
the event loop and a worker thread eight times a request: into the thread for the
middleware, back to the loop to resolve the URL, out again for CSRF's process_view
and for the view, back, and out once more for the middleware's responses. Each
crossing wakes a thread. Here the chain is built synchronous, as under WSGI, and run
whole in one worker thread: the same middleware, views and signals, two crossings.

Django also starts a thread for every request (a ThreadSensitiveContext of its own) and
joins it after: a thread's start and join, and on SQLite a fresh connection, for each
request. Here a request borrows a thread from `RequestThreads` instead, as a WSGI
server's threads serve one request after another (docs/live-delivery.md, "HTTP"), and a
response's body goes to the server in one message, not in 64 KiB ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.db import connections
from django.http import HttpRequest, HttpResponseBase


class RequestThreads:
    """Single-thread executors lent to one request at a time, and kept (up to `keep` idle).

    A thread comes back only once everything the request gave it has run: a request whose
    client went away leaves its view running, and the next request must not queue behind it.
    Used from the event loop's thread alone.
    """

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.idle: list[ThreadPoolExecutor] = []

    def borrow(self) -> ThreadPoolExecutor:
        # The most recently used first: its connection and caches are the warmest.
        if self.idle:
            return self.idle.pop()
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="request")

    def give_back(self, executor: ThreadPoolExecutor) -> None:
        loop = asyncio.get_running_loop()
        drained = executor.submit(_nothing)
        drained.add_done_callback(lambda _: loop.call_soon_threadsafe(self.keep_or_close, executor))

    def keep_or_close(self, executor: ThreadPoolExecutor) -> None:
        if len(self.idle) < self.keep:
            self.idle.append(executor)
        else:
            # The thread's connections (kept between requests on SQLite) end with it.
            executor.submit(connections.close_all)
            executor.shutdown(wait=False)


def _nothing() -> None:
    return None


class OneHopASGIHandler(ASGIHandler):
    # Idle threads kept: beyond this many requests at once, the extra threads end with their request.
    keep_threads = 8

    def __init__(self) -> None:
        super().__init__()
        self.threads = RequestThreads(self.keep_threads)

    @classmethod
    def chunk_bytes(cls, data: bytes) -> Iterator[tuple[bytes, bool]]:
        # A body already whole in memory goes as one message. Django cuts it into 64 KiB ones,
        # and each crossed channels and Twisted on its own: a 5,000-event page is about 1 MB.
        yield data, True

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        executor = self.threads.borrow()
        try:
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, receive, send)
        finally:
            self.threads.give_back(executor)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        # thread_sensitive: inside the request's ThreadSensitiveContext, on its borrowed thread,
        # the one that later runs request_finished (which closes or keeps its connection).
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)
