"""The demo agent's stdio: newline-delimited JSON-RPC, answering itself what the SDK cannot route.

The SDK's agent router (agent-client-protocol 0.12) has no `session/set_model` (the spec
moved it to `session/set_config_option`), but Hermes implements it and the workbench sends
it: requests named in `extra` are answered here, every other message goes to the SDK.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from acp import RequestError

log = logging.getLogger(__name__)

ExtraHandler = Callable[[dict[str, Any]], Awaitable[Any]]


class DemoTransport:
    """The SDK's message-level `Transport` on the agent's stdin (reader) and stdout (writer)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, extra: Mapping[str, ExtraHandler]
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._extra = extra
        self._lock = asyncio.Lock()
        self._answering: set[asyncio.Task[None]] = set()  # strong references until answered

    async def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message, separators=(",", ":")).encode() + b"\n"
        async with self._lock:
            self._writer.write(data)
            await self._writer.drain()

    async def receive(self) -> dict[str, Any] | None:
        while True:
            line = await self._reader.readline()
            if not line:
                return None
            try:
                message = json.loads(line)
            except ValueError:
                log.warning("client sent a line that is not JSON")
                continue
            handler = self._extra.get(message.get("method")) if isinstance(message, dict) else None
            if handler is None or "id" not in message:
                return message
            task = asyncio.ensure_future(self._answer(handler, message))
            self._answering.add(task)
            task.add_done_callback(self._answering.discard)

    async def _answer(self, handler: ExtraHandler, message: dict[str, Any]) -> None:
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
        params = message.get("params")
        try:
            reply["result"] = await handler(params if isinstance(params, dict) else {})
        except RequestError as exc:
            reply["error"] = exc.to_error_obj()
        await self.send(reply)

    async def close(self) -> None:
        self._writer.close()
