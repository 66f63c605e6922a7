"""The ASGI handler for HTTP: one thread hop per request.

Django's ASGIHandler builds an async middleware chain. With synchronous middleware
and views (ours, by choice: see hermesweb/middleware.py) that chain crosses between
the event loop and a worker thread eight times a request: into the thread for the
middleware, back to the loop to resolve the URL, out again for CSRF's process_view
and for the view, back, and out once more for the middleware's responses. Each
crossing wakes a thread. Here the chain is built synchronous, as under WSGI, and run
whole in one worker thread: the same middleware, views and signals, two crossings.
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest, HttpResponseBase


class OneHopASGIHandler(ASGIHandler):
    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        # thread_sensitive: inside ASGIHandler's ThreadSensitiveContext, one thread per
        # request, the one that later closes its database connection (request_finished).
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)
