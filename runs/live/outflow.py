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
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from runs.live.doorbell import tuning

log = logging.getLogger(__name__)

# Twisted's FileDescriptor.bufferSize: the buffer passed it when the transport pauses us.
TWISTED_BUFFER_BYTES = 64 * 1024


def max_backlog_bytes() -> int:
    return int(tuning("HERMESWEB_SOCKET_MAX_BACKLOG_BYTES", 4 * 1024 * 1024))


def stall_seconds() -> float:
    return tuning("HERMESWEB_SOCKET_STALL_SECONDS", 30.0)


class TooSlow(Exception):
    """The client did not read what was sent to it: close with 4008, it resumes from its cursors."""


class Outflow:
    """One socket's unwritten bytes, as its transport's push producer reports them."""

    # One per open socket: no per-instance dict.
    __slots__ = (
        "_drained",
        "_previous",
        "closed",
        "max_bytes",
        "pause_bytes",
        "paused",
        "peak",
        "stall",
        "too_slow",
        "transport",
        "unwritten",
    )

    def __init__(self, transport: Any, max_bytes: int, stall: float) -> None:
        self.transport = transport
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
        return Outflow(transport, max_backlog_bytes(), stall_seconds())
    except RuntimeError:
        log.warning("socket transport has a producer we cannot chain: its send buffer is not bounded")
        return None
