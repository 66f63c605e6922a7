"""A socket's bytes handed to the server and not yet written: bounded per socket.

Design note: docs/live-delivery.md ("A slow consumer"). daphne hands every frame to Twisted at
once, and Twisted keeps what the kernel does not take: a client that stops reading would grow
the web process by everything its run streams. `Outflow` is the socket's Twisted push producer,
so the transport says when its buffer passes `bufferSize` (paused) and when it is empty again
(resumed). While it is paused the subscription's own sends wait for the drain (replay goes at
the client's pace), the feed's skip the socket (its backlog, bounded by count, takes them), and
each frame still handed over (pongs, heartbeats) adds to `unwritten`. A socket not drained
within `stall_seconds`, or whose `unwritten` passes `max_bytes`, is closed with 4008; the
client resumes from its cursors.

It also writes a text frame straight to the socket (`write_text`) while the transport holds
nothing unwritten: the frame autobahn would build, one `send` with no trip through Channels,
daphne, autobahn and Twisted's write buffer (bench/README.md, fan-out).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import struct
from typing import Any, NamedTuple

from runs.live.doorbell import tuning

log = logging.getLogger(__name__)

# Twisted's FileDescriptor.bufferSize: the buffer passed it when the transport pauses us.
TWISTED_BUFFER_BYTES = 64 * 1024


def max_backlog_bytes() -> int:
    return int(tuning("HERMESWEB_SOCKET_MAX_BACKLOG_BYTES", 4 * 1024 * 1024))


def stall_seconds() -> float:
    return tuning("HERMESWEB_SOCKET_STALL_SECONDS", 30.0)


class WireFrame(NamedTuple):
    """A text message as a WebSocket frame from the server: unmasked, unfragmented, uncompressed."""

    payload_bytes: int
    data: bytes


def wire_frame(text: str) -> WireFrame:
    """`text` as the single frame autobahn's sendMessage writes for it (RFC 6455 §5.2).

    Every socket of a feed gets the same text object: the last one's frame is reused.
    """
    last = _last_frame
    if last and last[0] is text:
        return last[1]
    payload = text.encode()
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x81, n)
    elif n < 65536:
        head = struct.pack("!BBH", 0x81, 126, n)
    else:
        head = struct.pack("!BBQ", 0x81, 127, n)
    frame = WireFrame(n, head + payload)
    _last_frame[:] = (text, frame)
    return frame


_last_frame: list[Any] = []  # (text, its WireFrame): the text is kept alive, so `is` cannot mistake it


class TooSlow(Exception):
    """The client did not read what was sent to it: close with 4008, it resumes from its cursors."""


class Outflow:
    """One socket's unwritten bytes, as its transport's push producer reports them."""

    # One per open socket: no per-instance dict.
    __slots__ = (
        "_drained",
        "_previous",
        "closed",
        "direct",
        "max_bytes",
        "pause_bytes",
        "paused",
        "peak",
        "protocol",
        "stall",
        "too_slow",
        "transport",
        "unwritten",
    )

    def __init__(self, transport: Any, max_bytes: int, stall: float, protocol: Any = None) -> None:
        self.transport = transport
        # The socket's autobahn protocol (daphne's WebSocketProtocol): with it, write_text.
        self.protocol = protocol
        self.direct = protocol is not None and writes_plain_frames(transport, protocol)
        self.max_bytes = max_bytes
        self.stall = stall
        self.pause_bytes = int(getattr(transport, "bufferSize", TWISTED_BUFFER_BYTES))
        self.paused = False
        self.unwritten = 0  # an upper estimate while paused; 0 once the transport drained
        self.peak = 0
        self.closed = False
        self.too_slow: str | None = None  # why this socket is to be closed with 4008
        # Made only when something waits for a drain: an Event is ~850 bytes of every idle socket.
        self._drained: asyncio.Event | None = None
        # daphne's HTTP channel registered itself on the upgraded connection (it stops reading a
        # client it cannot write to): it keeps hearing pause and resume through us.
        self._previous = transport.producer
        if self._previous is not None:
            transport.unregisterProducer()
        transport.registerProducer(self, True)

    # ------------------------------------------------------------ Twisted's IPushProducer

    def pauseProducing(self) -> None:
        self.paused = True
        self.unwritten = max(self.unwritten, self.pause_bytes)
        self.peak = max(self.peak, self.unwritten)
        if self._previous is not None:
            self._previous.pauseProducing()

    def resumeProducing(self) -> None:
        self.paused = False
        self.unwritten = 0
        self._wake()
        if self._previous is not None:
            self._previous.resumeProducing()

    def stopProducing(self) -> None:
        self.closed = True
        self._wake()  # nothing waits on a connection that is gone
        if self._previous is not None:
            self._previous.stopProducing()

    def _wake(self) -> None:
        drained, self._drained = self._drained, None
        if drained is not None:
            drained.set()

    # ------------------------------------------------------------ the consumer's side

    def sent(self, nbytes: int) -> bool:
        """A frame of `nbytes` was handed to the transport. False once past the bound: close it."""
        if self.paused:
            self.unwritten += nbytes
            self.peak = max(self.peak, self.unwritten)
            if self.unwritten > self.max_bytes and self.too_slow is None:
                self.too_slow = f"{self.unwritten} bytes unwritten (bound {self.max_bytes})"
        return self.too_slow is None

    def write_text(self, text: str) -> bool:
        """Write `text` as one frame to the socket now, if nothing unwritten is ahead of it.

        False: not written (a transport that holds bytes, a closing socket, a frame over daphne's
        limit, not a plain TCP transport); the server's own send then takes it, in order, with
        its own rules. What the kernel does not take now, Twisted keeps, as it would have.
        """
        transport, protocol = self.transport, self.protocol
        if (
            not self.direct
            or not text  # daphne sends nothing for an empty text
            or self.paused
            or transport.dataBuffer
            or transport._tempDataLen
            or not transport.connected
            or transport.disconnecting
            or transport.TLS
            or protocol.state != protocol.STATE_OPEN
            or protocol.send_queue
        ):
            return False
        frame = wire_frame(text)
        if 0 < protocol.maxMessagePayloadSize < frame.payload_bytes:
            return False  # autobahn refuses it and daphne closes the socket: as before
        written = transport.writeSomeData(frame.data)
        if isinstance(written, BaseException):
            return False  # the connection is lost: the server's send meets it as it would
        if written < len(frame.data):
            transport.write(frame.data[written:])
        return True

    def has_room(self) -> bool:
        """Whether a frame may go now without waiting: the transport is not holding a backlog."""
        return not self.paused and self.too_slow is None

    async def room(self) -> None:
        """Return once the transport drained; TooSlow if it has not within `stall` seconds."""
        if self.too_slow is not None:
            raise TooSlow(self.too_slow)
        if not self.paused or self.closed:
            return
        if self._drained is None:
            self._drained = asyncio.Event()
        try:
            await asyncio.wait_for(self._drained.wait(), self.stall)
        except TimeoutError:
            self.too_slow = f"{self.unwritten} bytes unwritten for {self.stall:g} s"
            raise TooSlow(self.too_slow) from None


def watch(send: Any) -> Outflow | None:
    """The Outflow of the socket behind an ASGI `send`, under daphne; None under another server.

    daphne's `send` is `partial(server.handle_reply, protocol)` and the protocol has the Twisted
    transport. Elsewhere (uvicorn, the test communicator) nothing is watched: uvicorn's send
    waits for its transport to drain, so a slow client slows its own socket there.
    """
    if not isinstance(send, functools.partial) or not send.args:
        return None
    transport = getattr(send.args[0], "transport", None)
    if transport is None or not hasattr(transport, "registerProducer") or not hasattr(transport, "producer"):
        return None
    try:
        return Outflow(transport, max_backlog_bytes(), stall_seconds(), send.args[0])
    except RuntimeError:
        log.warning("socket transport has a producer we cannot chain: its send buffer is not bounded")
        return None


def writes_plain_frames(transport: Any, protocol: Any) -> bool:
    """Whether `write_text` may write to this socket: a Twisted TCP transport without TLS, and
    frames that autobahn sends as they are (no compression, masking or fragmenting)."""
    twisted_tcp = all(
        hasattr(transport, name)
        for name in ("writeSomeData", "write", "dataBuffer", "_tempDataLen", "connected", "disconnecting")
    )
    autobahn = all(
        hasattr(protocol, name) for name in ("state", "STATE_OPEN", "send_queue", "maxMessagePayloadSize")
    )
    return (
        twisted_tcp
        and autobahn
        and getattr(transport, "TLS", None) is False
        and getattr(protocol, "websocket_extensions_in_use", None) == []
        and getattr(protocol, "maskServerFrames", None) is False
        and getattr(protocol, "autoFragmentSize", None) == 0
    )
