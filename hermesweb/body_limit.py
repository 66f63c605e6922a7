"""Request bodies capped before Django reads them (docs/security.md, "Limits").

Django's DATA_UPLOAD_MAX_MEMORY_SIZE is checked only after the body was read, and its ASGI
handler spools whatever arrives into a temporary file first. `BodyLimit` wraps the HTTP app:
a declared Content-Length over the route's allowance is answered 413 before a byte is read,
and a streamed (chunked) body is counted chunk by chunk and cut off the moment it passes.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson
from django.conf import settings

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# The attachment upload is the one route that takes a file: its allowance plus the multipart framing.
ATTACHMENT_ROUTE = re.compile(r"^/api/sessions/\d{1,19}/attachments/?$")
MULTIPART_OVERHEAD = 64 * 1024
# A webhook's JSON body (automations.api.HOOK_MAX_BYTES): refused before it is read.
HOOK_ROUTE = re.compile(r"^/api/hooks/[^/]*$")
HOOK_MAX_BYTES = 64 * 1024


def limit_for(method: str, path: str) -> int:
    """The most bytes of body a request to this route may carry."""
    if method == "POST" and ATTACHMENT_ROUTE.match(path):
        return int(settings.HERMESWEB_ATTACHMENT_MAX_BYTES) + MULTIPART_OVERHEAD
    if method == "POST" and HOOK_ROUTE.match(path):
        return HOOK_MAX_BYTES
    return int(settings.HERMESWEB_MAX_REQUEST_BYTES)


def declared_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdecimal() and len(text) < 19 else None
    return None


def too_large_body(limit: int) -> bytes:
    return orjson.dumps(
        {
            "code": "request_too_large",
            "message": f"The request body is larger than this route allows ({limit} bytes).",
            "details": {"limit": limit},
        }
    )


async def refuse(send: Send, limit: int) -> None:
    body = too_large_body(limit)
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                # The rest of the body is never read: the connection cannot be reused.
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """ASGI middleware: 413 `request_too_large` for a body over `limit_for` its route."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = limit_for(scope.get("method", "GET"), scope.get("path", ""))
        declared = declared_length(scope)
        if declared is not None and declared > limit:
            await refuse(send, limit)
            return
        await self.app(scope, *Counted(receive, send, limit).channels())


class Counted:
    """`receive` and `send` of one request whose body is counted as it streams in."""

    def __init__(self, receive: Receive, send: Send, limit: int) -> None:
        self.inner_receive, self.inner_send, self.limit = receive, send, limit
        self.received = 0
        self.refused = False
        self.started = False

    def channels(self) -> tuple[Receive, Send]:
        return self.receive, self.send

    async def receive(self) -> Message:
        if self.refused:
            return {"type": "http.disconnect"}
        message = await self.inner_receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit and not self.started:
                # Django reads the whole body before it answers, so nothing was sent yet: answer
                # here, and tell the app the client left so it drops the request.
                self.refused = True
                await refuse(self.inner_send, self.limit)
                return {"type": "http.disconnect"}
        return message

    async def send(self, message: Message) -> None:
        if self.refused:
            return
        self.started = True
        await self.inner_send(message)


# ---------------------------------------------------------------- under daphne


def guard_daphne() -> None:
    """Refuse an over-long body while daphne is still receiving it.

    Twisted, under daphne, reads a whole body (past 100 kB into a temporary file) before the
    ASGI app is called, so `BodyLimit` alone would answer only once it all arrived. The guard
    checks the declared length when the headers are in and counts the chunks as they come;
    past the route's allowance it writes the 413 itself and stops reading the connection.
    """
    try:
        from daphne.http_protocol import WebRequest
    except ImportError:  # another ASGI server: BodyLimit streams its bodies through
        return
    if getattr(WebRequest, "hermesweb_guarded", False):
        return
    got_length, content_chunk, request_received = (
        WebRequest.gotLength,
        WebRequest.handleContentChunk,
        WebRequest.requestReceived,
    )

    def gotLength(self: Any, length: int | None) -> None:
        self.hermesweb_limit = _channel_limit(self.channel)
        self.hermesweb_received = 0
        self.hermesweb_refused = False
        if length is not None and length > self.hermesweb_limit:
            _refuse_raw(self)
            return
        got_length(self, length)

    def handleContentChunk(self: Any, data: bytes) -> None:
        if self.hermesweb_refused:
            return
        self.hermesweb_received += len(data)
        if self.hermesweb_received > self.hermesweb_limit:
            _refuse_raw(self)
            return
        content_chunk(self, data)

    def requestReceived(self: Any, command: bytes, path: bytes, version: bytes) -> None:
        if getattr(self, "hermesweb_refused", False):
            return
        request_received(self, command, path, version)

    WebRequest.gotLength = gotLength
    WebRequest.handleContentChunk = handleContentChunk
    WebRequest.requestReceived = requestReceived
    WebRequest.hermesweb_guarded = True


def _channel_limit(channel: Any) -> int:
    # Twisted hands the request line to the request only after the body; until then the channel
    # holds it. Should that ever move, every route gets the largest allowance (BodyLimit still
    # applies the exact one).
    command, path = getattr(channel, "_command", None), getattr(channel, "_path", None)
    if not isinstance(command, bytes) or not isinstance(path, bytes):
        return limit_for("POST", "/api/sessions/1/attachments")
    target = path.split(b"?", 1)[0].decode("latin-1")
    return limit_for(command.decode("latin-1"), target)


def _refuse_raw(request: Any) -> None:
    request.hermesweb_refused = True
    request.client_addr = None  # daphne logs it on disconnect; it is set only once a request runs
    body = too_large_body(request.hermesweb_limit)
    head = (
        "HTTP/1.1 413 Request Entity Too Large\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    transport = request.channel.transport
    transport.write(head.encode() + body)
    transport.loseConnection()  # stops reading at once; closes once the answer is written
