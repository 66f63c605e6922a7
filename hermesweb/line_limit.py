"""An over-long request line or header line answered, not dropped (docs/security.md, "Limits").

Twisted, under daphne, reads the request line and each header line up to `HTTPChannel.MAX_LENGTH`
(16 KiB) and past it closes the connection without a word: a client cannot tell a URL too long
from a network failure. The guard answers 414 `uri_too_long` for the request line and 431
`headers_too_large` for a header line, in the API's error shape, then closes the connection.
"""

from __future__ import annotations

from typing import Any

import orjson

# (status, reason, code, message) for the request line, and for a header line.
REQUEST_LINE = (
    414,
    "URI Too Long",
    "uri_too_long",
    "The request line (method and URL) is longer than {limit} bytes.",
)
HEADER_LINE = (
    431,
    "Request Header Fields Too Large",
    "headers_too_large",
    "A header line is longer than {limit} bytes.",
)


def answer(first_line: bool, limit: int) -> bytes:
    """The whole HTTP answer for a line past `limit` bytes: the request line's, or a header's."""
    status, reason, code, message = REQUEST_LINE if first_line else HEADER_LINE
    body = orjson.dumps({"code": code, "message": message.format(limit=limit), "details": {"limit": limit}})
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def guard_daphne_lines() -> None:
    """Answer a line over Twisted's limit with 414/431 instead of closing without a word."""
    try:
        from twisted.web.http import HTTPChannel
    except ImportError:  # not under Twisted: the server answers for itself
        return
    if getattr(HTTPChannel, "hermesweb_lines_guarded", False):
        return

    def lineLengthExceeded(self: Any, line: bytes) -> None:
        # Twisted's own flag: set while the next line read is a request line (1, or 2 after a
        # stray blank line), 0 once it has been read and headers follow.
        first_line = bool(getattr(self, "_HTTPChannel__first_line", 1))
        self.transport.write(answer(first_line, self.MAX_LENGTH))
        self.transport.loseConnection()

    HTTPChannel.lineLengthExceeded = lineLengthExceeded
    HTTPChannel.hermesweb_lines_guarded = True
