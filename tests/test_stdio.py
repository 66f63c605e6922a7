"""runs.runner.stdio: ACP's newline-delimited JSON over an agent's pipes."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from runs.runner.stdio import StdioTransport


class Pipe:
    """The writer end a transport sends into: keeps the bytes."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        return None


def received(raw: bytes, limit: int = 64 * 1024, on_session_update: Any = None) -> list[Any]:
    async def go() -> list[Any]:
        reader = asyncio.StreamReader(limit=limit)
        reader.feed_data(raw)
        reader.feed_eof()
        transport = StdioTransport(reader, Pipe(), on_session_update)  # type: ignore[arg-type]
        out = []
        while (message := await transport.receive()) is not None:
            out.append(message)
        return out

    return asyncio.run(go())


def test_it_reads_one_message_per_line_and_ends_at_eof() -> None:
    assert received(b'{"jsonrpc":"2.0","method":"a"}\n\n  {"id":1,"result":{"x":"\xc3\xbc"}}\n') == [
        {"jsonrpc": "2.0", "method": "a"},
        {"id": 1, "result": {"x": "ü"}},
    ]


def test_a_last_line_without_a_newline_still_counts() -> None:
    assert received(b'{"id":1}\n{"id":2}') == [{"id": 1}, {"id": 2}]


def test_lines_longer_than_the_buffer_limit_arrive_whole() -> None:
    text = "x" * 5000
    assert received(b'{"text":"' + text.encode() + b'"}\n{"id":2}\n', limit=256) == [
        {"text": text},
        {"id": 2},
    ]


def test_lines_that_are_not_messages_are_skipped_not_fatal() -> None:
    assert received(b'not json\n[1,2]\n{"id":3}\n') == [{"id": 3}]


def test_a_stray_line_is_logged_without_the_secret_it_carries(caplog: pytest.LogCaptureFixture) -> None:
    assert received(b"token ghp_abcdefghijklmnopqrstuvwxyz0123 leaked\n") == []
    assert "not JSON" in caplog.text
    assert "ghp_abcdefghijklmnopqrstuvwxyz0123" not in caplog.text


def test_sent_messages_are_one_json_line_each_even_when_orjson_refuses_them() -> None:
    pipe = Pipe()

    async def go() -> None:
        transport = StdioTransport(asyncio.StreamReader(), pipe)  # type: ignore[arg-type]
        await asyncio.gather(transport.send({"id": 1, "params": {"t": "ü"}}), transport.send({"id": 2**70}))

    asyncio.run(go())
    assert pipe.data == b'{"id":1,"params":{"t":"\xc3\xbc"}}\n{"id":1180591620717411303424}\n'


def test_session_updates_go_to_the_handler_in_order_and_everything_else_to_the_sdk() -> None:
    routed: list[tuple[str, Any]] = []

    def handler(session_id: str, update: dict[str, Any]) -> None:
        if update.get("boom"):
            raise RuntimeError("a bad update")
        routed.append((session_id, update["n"]))

    def update(n: int, **extra: Any) -> bytes:
        params = {"sessionId": "s1", "update": {"sessionUpdate": "agent_message_chunk", "n": n, **extra}}
        return orjson.dumps({"jsonrpc": "2.0", "method": "session/update", "params": params}) + b"\n"

    raw = (
        update(1)
        + update(2, boom=True)  # logged and dropped; the stream goes on
        + b'{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":7}}\n'  # malformed
        + b'{"jsonrpc":"2.0","id":4,"method":"session/request_permission","params":{}}\n'
        + update(3)
        + b'{"jsonrpc":"2.0","id":1,"result":{"stopReason":"end_turn"}}\n'
    )

    rest = received(raw, on_session_update=handler)

    assert routed == [("s1", 1), ("s1", 3)]
    assert [m.get("id") for m in rest] == [None, 4, 1]
    assert rest[0]["params"] == {"sessionId": 7}
