"""ACP over an agent's stdio: the SDK's connection on a leaner newline-delimited JSON transport.

Design note: docs/runner.md ("Reading the agent"). With a hundred runs streaming into one
runner, the SDK's per-message work was most of the runner's event loop: its stdio transport
wraps every line in `asyncio.wait_for` and decodes it with the stdlib `json`, and each
notification becomes a task that validates it into pydantic models, which the runner then
dumped back into the dict the agent had sent.

This is the SDK's message-level `Transport` interface (`acp.connect_to_agent` accepts
one): the same framing, read with a plain `readuntil` and orjson. `session/update`
notifications — nearly all of a turn's traffic — go straight to `on_session_update` as
the agent's JSON, in the order they were read, so every update is routed before the
SDK sees the answer that follows it (the SDK needs a tracker for that). Requests,
responses and every other notification go to the SDK as before. Spawning and the
defensive shutdown (stdin closed, then terminate, then kill) stay the SDK's.

Two things the typed SDK (0.12) cannot do go through here too (runs/runner/session_config.py):
`request()` sends a raw JSON-RPC request (`session/set_model`, which 0.12 dropped) under ids
of its own, and the raw answers to the session-opening requests reach `on_session_opened`
before the SDK validates them (its models drop the `models` field Hermes sends).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import acp
import orjson
from acp.transports import default_environment

from runs.redaction import redact_text

log = logging.getLogger(__name__)

SessionUpdateHandler = Callable[[str, dict[str, Any]], None]
SessionOpenedHandler = Callable[[str, dict[str, Any]], None]
# Requests whose answers describe a session (its modes, models): session id → the raw answer.
SESSION_OPENING = frozenset({"session/new", "session/load", "session/fork", "session/resume"})
RAW_ID_PREFIX = "hermesweb-"  # string ids: never an id the SDK's integer counter hands out


class AgentDied(Exception):
    """The agent process exited (or its pipes closed) while we needed it."""


class StdioTransport:
    """Newline-delimited JSON-RPC over a child's stdout (in) and stdin (out)."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        on_session_update: SessionUpdateHandler | None = None,
        on_session_opened: SessionOpenedHandler | None = None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._send_lock = asyncio.Lock()
        self._on_session_update = on_session_update
        self._on_session_opened = on_session_opened
        self._opening: dict[Any, str] = {}  # request id → the session id it names ("" for new)
        self._raw: dict[str, asyncio.Future[Any]] = {}
        self._raw_ids = itertools.count(1)

    async def request(self, method: str, params: dict[str, Any]) -> Any:
        """A JSON-RPC request the SDK's typed API lacks; its `result`, or acp.RequestError."""
        request_id = f"{RAW_ID_PREFIX}{next(self._raw_ids)}"
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._raw[request_id] = answer
        try:
            await self.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
            return await answer
        finally:
            self._raw.pop(request_id, None)

    async def send(self, message: dict[str, Any]) -> None:
        if message.get("method") in SESSION_OPENING and "id" in message and self._on_session_opened:
            params = message.get("params")
            self._opening[message["id"]] = (
                str(params.get("sessionId") or "") if isinstance(params, dict) else ""
            )
        try:
            data = orjson.dumps(message)
        except TypeError:  # what orjson will not encode (ints past 64 bits …), json will
            data = json.dumps(message, separators=(",", ":")).encode()
        async with self._send_lock:  # one message's bytes never interleave with another's
            self._writer.write(data + b"\n")
            await self._writer.drain()

    async def receive(self) -> dict[str, Any] | None:
        """The next message; None at end of stream. A line that is not JSON is logged and skipped."""
        while True:
            line = await self._read_line()
            if line is None:
                self._fail_raw()
                return None
            line = line.strip()
            if not line:
                continue
            try:
                message = orjson.loads(line)
            except orjson.JSONDecodeError:
                log.error("agent sent a line that is not JSON: %r", _snippet(line))
                continue
            if not isinstance(message, dict):
                log.error("agent sent JSON that is not a JSON-RPC message: %r", _snippet(line))
            elif "method" not in message and self._took_response(message):
                continue
            elif not self._took_session_update(message):
                return message

    def _took_response(self, message: dict[str, Any]) -> bool:
        """A raw request's answer (taken: the SDK never sent it); a session-opening answer is seen."""
        request_id = message.get("id")
        answer = self._raw.pop(request_id, None) if isinstance(request_id, str) else None
        if answer is not None:
            if answer.done():
                return True
            error = message.get("error")
            if isinstance(error, dict):
                answer.set_exception(
                    acp.RequestError(
                        int(error.get("code", -32603)), str(error.get("message", "")), error.get("data")
                    )
                )
            else:
                answer.set_result(message.get("result"))
            return True
        named = self._opening.pop(request_id, None) if request_id is not None else None
        result = message.get("result")
        if named is not None and isinstance(result, dict) and self._on_session_opened is not None:
            session_id = str(result.get("sessionId") or named)
            if session_id:
                try:
                    self._on_session_opened(session_id, result)
                except Exception:
                    log.exception("session-opened handler failed for session %s", session_id)
        return False

    def _fail_raw(self) -> None:
        for answer in self._raw.values():
            if not answer.done():
                answer.set_exception(ConnectionError("the agent closed its output"))

    def _took_session_update(self, message: dict[str, Any]) -> bool:
        if self._on_session_update is None or message.get("method") != "session/update" or "id" in message:
            return False
        params = message.get("params")
        if not isinstance(params, dict):
            return False  # malformed: the SDK answers it as it would
        session_id, update = params.get("sessionId"), params.get("update")
        if not isinstance(session_id, str) or not isinstance(update, dict):
            return False
        try:
            self._on_session_update(session_id, update)
        except Exception:  # one bad update must not stop the agent's stream
            log.exception("session/update handler failed for session %s", session_id)
        return True

    async def _read_line(self) -> bytes | None:
        chunks: list[bytes] = []
        while True:
            try:
                chunks.append(await self._reader.readuntil(b"\n"))
                return b"".join(chunks)
            except asyncio.LimitOverrunError as exc:
                # A line longer than the stream's buffer limit: take it in pieces.
                chunks.append(await self._reader.readexactly(exc.consumed))
            except asyncio.IncompleteReadError as exc:
                chunks.append(exc.partial)
                line = b"".join(chunks)
                return line or None

    async def close(self) -> None:
        # The process's stdin is closed by spawn_stdio_transport's shutdown sequence.
        return None


def _snippet(line: bytes) -> str:
    # Logs are not the journal, but an agent's stray output can still carry a key.
    return redact_text(line[:200].decode(errors="replace"))


@contextlib.asynccontextmanager
async def spawn_agent(
    client: Any,
    command: str,
    *args: str,
    env: Mapping[str, str] | None,
    cwd: str,
    stderr: Any,
    limit: int,
    on_session_update: SessionUpdateHandler | None = None,
    on_session_opened: SessionOpenedHandler | None = None,
    pass_fds: tuple[int, ...] = (),
) -> AsyncIterator[tuple[acp.ClientSideConnection, asyncio.subprocess.Process, StdioTransport]]:
    """Like `acp.spawn_agent_process`, on StdioTransport (also yielded: for its raw requests).

    `pass_fds`: descriptors the child keeps (the sandbox's binds).
    """
    async with spawn_stdio(
        command, *args, env=env, cwd=cwd, stderr=stderr, limit=limit, pass_fds=pass_fds
    ) as (
        reader,
        writer,
        process,
    ):
        transport = StdioTransport(reader, writer, on_session_update, on_session_opened)
        conn = acp.connect_to_agent(client, transport, use_unstable_protocol=True)
        try:
            yield conn, process, transport
        finally:
            await conn.close()


# An agent's files are the user's project files: readable by the user's other tools, whatever
# umask the service keeps for its own data.
AGENT_UMASK = 0o022
SHUTDOWN_SECONDS = 2.0


@contextlib.asynccontextmanager
async def spawn_stdio(
    command: str,
    *args: str,
    env: Mapping[str, str] | None,
    cwd: str,
    stderr: Any,
    limit: int,
    pass_fds: tuple[int, ...] = (),
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter, asyncio.subprocess.Process]]:
    """`acp.transports.spawn_stdio_transport` with the descriptors the sandbox binds and the
    agent's umask; the same shutdown: stdin closed, then terminate, then kill."""
    process = await asyncio.create_subprocess_exec(
        command,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=stderr,
        env={**default_environment(), **(env or {})},
        cwd=cwd,
        limit=limit,
        pass_fds=pass_fds,
        umask=AGENT_UMASK,
    )
    assert process.stdout is not None and process.stdin is not None
    try:
        yield process.stdout, process.stdin, process
    finally:
        stdin = process.stdin
        with contextlib.suppress(Exception):
            stdin.write_eof()
        with contextlib.suppress(Exception):
            stdin.close()
            await stdin.wait_closed()
        try:
            await asyncio.wait_for(process.wait(), SHUTDOWN_SECONDS)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            try:
                await asyncio.wait_for(process.wait(), SHUTDOWN_SECONDS)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
