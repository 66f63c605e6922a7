"""A lean asyncio WebSocket client for measuring servers, not itself.

Hundreds of sockets share one client process and both cores with the server under
test, so each received frame must cost as little as possible: a bare
`asyncio.Protocol`, no compression offered, frames parsed in place, one clock read
per read() rather than per frame. It speaks just enough RFC 6455 for a server's
text frames, pings and close.
"""

from __future__ import annotations

import asyncio
import base64
import os
import struct
import time
from collections.abc import Callable
from typing import Any

import orjson

OnFrame = Callable[[bytes, float], None]


def envelopes(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The event envelopes a decoded server frame carries: one `event`, or a catch-up `events` page."""
    kind = message.get("type")
    if kind == "event":
        return [message["event"]]
    if kind == "events":
        return message["events"]
    return []


class Handshake(Exception):
    pass


class WSClient(asyncio.Protocol):
    def __init__(self, on_frame: OnFrame) -> None:
        self.on_frame = on_frame
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.upgraded: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self.frames = 0
        self._fragments: list[bytes] = []

    # -------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.upgraded.done():
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end])
            del self.buf[: end + 4]
            if b" 101 " not in head.split(b"\r\n", 1)[0]:
                self.upgraded.set_exception(Handshake(head.decode(errors="replace")))
                return
            self.upgraded.set_result(None)
        self._parse(time.time())

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.upgraded.done():
            self.upgraded.set_exception(Handshake(f"connection lost during handshake: {exc}"))
        if not self.closed.done():
            self.closed.set_result(None)

    # -------------------------------------------------------------- frames

    def _parse(self, now: float) -> None:
        buf, pos, size = self.buf, 0, len(self.buf)
        while size - pos >= 2:
            b0, b1 = buf[pos], buf[pos + 1]
            length = b1 & 0x7F
            head = 2
            if length == 126:
                if size - pos < 4:
                    break
                length = (buf[pos + 2] << 8) | buf[pos + 3]
                head = 4
            elif length == 127:
                if size - pos < 10:
                    break
                length = struct.unpack_from("!Q", buf, pos + 2)[0]
                head = 10
            end = pos + head + length
            if end > size:
                break
            payload = bytes(buf[pos + head : end])
            pos = end
            opcode = b0 & 0x0F
            fin = b0 & 0x80
            if opcode == 0x1 and fin:
                self.frames += 1
                self.on_frame(payload, now)
            elif opcode in (0x1, 0x2, 0x0):
                self._fragments.append(payload)
                if fin:
                    whole = b"".join(self._fragments)
                    self._fragments.clear()
                    self.frames += 1
                    self.on_frame(whole, now)
            elif opcode == 0x9:
                self._write(0xA, payload)
            elif opcode == 0x8:
                code = struct.unpack_from("!H", payload)[0] if len(payload) >= 2 else None
                if not self.closed.done():
                    self.closed.set_result(code)
                self._write(0x8, payload[:2])
                if self.transport is not None:
                    self.transport.close()
        if pos:
            del buf[:pos]

    def _write(self, opcode: int, payload: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        mask = os.urandom(4)
        n = len(payload)
        if n < 126:
            header = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 65536:
            header = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            header = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        # Clients must mask (RFC 6455 §5.3); XOR as one big integer, not byte by byte.
        repeated = (mask * (n // 4 + 1))[:n]
        masked = (int.from_bytes(payload, "big") ^ int.from_bytes(repeated, "big")).to_bytes(n, "big")
        self.transport.write(header + mask + masked)

    def send_text(self, text: str | bytes) -> None:
        self._write(0x1, text.encode() if isinstance(text, str) else text)

    def send_json(self, message: object) -> None:
        self._write(0x1, orjson.dumps(message))

    def close(self) -> None:
        self._write(0x8, struct.pack("!H", 1000))
        if self.transport is not None:
            self.transport.close()


async def connect(
    port: int,
    path: str,
    on_frame: OnFrame,
    *,
    cookie: str | None = None,
    origin: str | None = None,
    timeout: float = 30.0,
) -> WSClient:
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(lambda: WSClient(on_frame), "127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
    ]
    if origin:
        lines.append(f"Origin: {origin}")
    if cookie:
        lines.append(f"Cookie: sessionid={cookie}")
    assert client.transport is not None
    client.transport.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    await asyncio.wait_for(client.upgraded, timeout)
    return client


async def connect_many(
    n: int,
    port: int,
    path: str | Callable[[int], str],
    make_on_frame: Callable[[int], OnFrame],
    *,
    cookie: str | None = None,
    origin: str | None = None,
    parallel: int = 25,
) -> list[WSClient]:
    """Open n sockets, a few at a time (a burst of 200 handshakes only measures the accept queue).

    `path` is one path for all, or socket i's path.
    """
    path_of = path if callable(path) else (lambda i: path)
    clients: list[WSClient] = []
    for start in range(0, n, parallel):
        batch = range(start, min(n, start + parallel))
        clients += await asyncio.gather(
            *(connect(port, path_of(i), make_on_frame(i), cookie=cookie, origin=origin) for i in batch)
        )
    return clients
