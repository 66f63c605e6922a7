"""A frame written straight to the socket (runs.live.outflow.Outflow.write_text) is the frame
daphne would have sent, and never overtakes bytes the server still holds.

The first tests use daphne's own WebSocket protocol, built by daphne's factory with the options
daphne's server sets, on a real Twisted TCP transport over a socket pair: no event loop, no
timing. The last streams through a real daphne to a client that stops reading, then reads on.
"""

from __future__ import annotations

import functools
import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from daphne.ws_protocol import WebSocketFactory
from twisted.internet import tcp
from twisted.internet.testing import MemoryReactor
from websockets.sync.client import connect

from runs import journal
from runs.live.outflow import Outflow, watch, wire_frame
from runs.models import Run, RunStatus
from tests import factories
from tests.support.live import LiveSocket, LiveStack, assert_contiguous, layer, live, session_cookie  # noqa: F401

MAX_MESSAGE = 1024 * 1024  # daphne's default websocket_max_message_size


class Socket:
    """daphne's protocol for one accepted socket, and the client's end of it."""

    def __init__(self) -> None:
        self.server_end, self.client = socket.socketpair()
        self.server_end.setblocking(False)
        factory = WebSocketFactory(object(), server="daphne")
        # As daphne.server.Server.run sets them.
        factory.setProtocolOptions(
            autoPingTimeout=30,
            allowNullOrigin=True,
            openHandshakeTimeout=5,
            maxMessagePayloadSize=MAX_MESSAGE,
            maxFramePayloadSize=MAX_MESSAGE,
        )
        self.protocol: Any = factory.buildProtocol(None)
        self.transport = tcp.Server(
            self.server_end, self.protocol, ("127.0.0.1", 1), None, 1, MemoryReactor()
        )
        self.protocol.makeConnection(self.transport)
        # What the opening handshake (autobahn's, then daphne's onConnect) leaves behind when the
        # client offered no extension.
        self.protocol.state = self.protocol.STATE_OPEN
        self.protocol.websocket_extensions_in_use = []
        self.protocol.client_addr = ["127.0.0.1", 1]

    def outflow(self) -> Outflow:
        # daphne's ASGI `send` is partial(server.handle_reply, protocol).
        outflow = watch(functools.partial(lambda protocol, message: None, self.protocol))
        assert outflow is not None and outflow.direct
        return outflow

    def server_send(self, text: str) -> None:
        """What daphne does for {"type": "websocket.send", "text": text}."""
        self.protocol.handle_reply({"type": "websocket.send", "text": text})

    def flush(self) -> bytes:
        """Everything on the wire: Twisted's buffer written out as the client reads."""
        received = bytearray()
        self.client.setblocking(False)
        while True:
            if self.transport.dataBuffer or self.transport._tempDataLen:
                self.transport.doWrite()
            try:
                chunk = self.client.recv(1 << 20)
            except BlockingIOError:
                if not (self.transport.dataBuffer or self.transport._tempDataLen):
                    return bytes(received)
                continue
            received += chunk


def text_frames(data: bytes) -> Iterator[str]:
    """The server's text frames in `data` (RFC 6455: unmasked, each whole)."""
    pos = 0
    while pos < len(data):
        assert data[pos] == 0x81, f"not a final text frame at {pos}"
        length, pos = data[pos + 1] & 0x7F, pos + 2
        if length == 126:
            (length,), pos = struct.unpack_from("!H", data, pos), pos + 2
        elif length == 127:
            (length,), pos = struct.unpack_from("!Q", data, pos), pos + 8
        yield data[pos : pos + length].decode()
        pos += length


TEXTS = [
    "x",
    "a" * 125,
    "a" * 126,
    "é" * 63 + "a",  # 127 bytes in UTF-8, 64 characters
    "b" * 65535,
    "c" * 65536,
    '{"type":"event","event":{"delta":"ünïcødé ✓ 🎉"}}',
]


@pytest.mark.parametrize("text", TEXTS, ids=lambda t: f"{len(t.encode())}-bytes")
def test_a_frame_written_directly_is_byte_for_byte_what_daphne_sends(text: str) -> None:
    sock = Socket()
    sock.server_send(text)
    by_daphne = sock.flush()
    assert sock.outflow().write_text(text)
    assert sock.flush() == by_daphne == wire_frame(text).data


def test_a_direct_write_never_overtakes_bytes_the_server_holds() -> None:
    sock = Socket()
    outflow = sock.outflow()
    sock.server_send("held by Twisted")  # a pong, a close, a heartbeat: buffered for the loop
    assert not outflow.write_text("second"), "it went ahead of the held frame"
    sock.server_send("second")  # the consumer's fallback: the server's own send, in order
    assert list(text_frames(sock.flush())) == ["held by Twisted", "second"]
    assert outflow.write_text("third")  # nothing held now: straight to the socket
    assert list(text_frames(sock.flush())) == ["third"]


def test_what_the_kernel_does_not_take_stays_in_order_behind_it() -> None:
    sock = Socket()
    sock.server_end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sock.client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    outflow = sock.outflow()
    big = "".join(f"{n:06d}" for n in range(100_000))  # 600 KB: far more than the kernel takes
    assert outflow.write_text(big)
    assert sock.transport._tempDataLen, "the kernel took it all: this test proves nothing"
    assert not outflow.write_text("after"), "it went ahead of the big frame's rest"
    sock.server_send("after")
    assert list(text_frames(sock.flush())) == [big, "after"]


def test_what_daphne_would_refuse_or_not_send_goes_its_way() -> None:
    sock = Socket()
    outflow = sock.outflow()
    assert not outflow.write_text("x" * (MAX_MESSAGE + 1))  # autobahn refuses it, daphne closes
    assert not outflow.write_text("")  # daphne sends nothing for it
    sock.protocol.state = sock.protocol.STATE_CLOSING
    assert not outflow.write_text("after the close frame")
    assert sock.flush() == b""


def test_a_socket_with_an_extension_in_use_is_never_written_directly() -> None:
    sock = Socket()
    sock.protocol.websocket_extensions_in_use = ["permessage-deflate"]
    outflow = Outflow(sock.transport, MAX_MESSAGE, 30.0, sock.protocol)
    assert not outflow.direct
    assert not outflow.write_text("compressed by autobahn, not by us")


@pytest.mark.django_db(transaction=True)
def test_a_client_that_stalls_then_reads_on_gets_every_event_once_in_order(live: LiveStack) -> None:
    """Its socket's frames go straight to the kernel until it is full, then through Twisted's
    buffer (and the feed's backlog, or a resync) while it does not read, then straight again."""
    live.start_daphne()
    session = factories.SessionFactory()
    run = factories.RunFactory(session=session, status=RunStatus.RUNNING)
    cookie = session_cookie(session.project.owner)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.connect(("127.0.0.1", live.port))
    client = LiveSocket(
        live.sockets.enter_context(
            connect(
                live.url(session.pk),
                sock=sock,
                origin=live.origin(),  # type: ignore[arg-type]
                additional_headers={"Cookie": f"sessionid={cookie}"},
                proxy=None,
                max_size=None,
                max_queue=1,  # the library stops reading the socket while a frame waits for recv()
                open_timeout=30,
            )
        )
    )
    client.subscribe({run.pk: 0})
    client.session()
    journal.append_batch(run.pk, [journal.NewEvent("token.delta", {"message_id": "m1", "delta": "first"})])
    assert [e["seq"] for e in client.events_until(run.pk, lambda e: e["seq"] == 1)] == [1]

    filler = "x" * 3000  # ~1.2 MB while the client reads nothing: far past the kernel's buffers
    for start in range(2, 402, 20):
        batch = [
            journal.NewEvent("token.delta", {"message_id": "m1", "delta": f"{n}:{filler}"})
            for n in range(start, start + 20)
        ]
        journal.append_batch(run.pk, batch)
    journal.append_batch(run.pk, [journal.done_event("completed")])

    rest = client.events_to_terminal(run.pk, timeout=120)
    last = Run.objects.get(pk=run.pk).last_seq
    assert_contiguous(rest, 2, last)
    assert [e["payload"]["delta"].split(":")[0] for e in rest[:-1]] == [str(n) for n in range(2, 402)]
    assert rest[-1]["type"] == "done"
