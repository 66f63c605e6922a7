"""A small recording ACP client for driving real agent processes in tests.

It records every ``session/update`` (and every raw JSON-RPC message, in wire order), answers
permission and elicitation requests from configurable policies, and lets tests wait on events
instead of sleeping.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from acp import PROTOCOL_VERSION, RequestError, spawn_agent_process
from acp.client.connection import ClientSideConnection
from acp.connection import StreamDirection, StreamEvent
from acp.schema import (
    AcceptElicitationResponse,
    AllowedOutcome,
    CancelElicitationResponse,
    ClientCapabilities,
    DeclineElicitationResponse,
    DeniedOutcome,
    ElicitationCapabilities,
    ElicitationFormCapabilities,
    ElicitationMode,
    Implementation,
    InitializeResponse,
    PermissionOption,
    RequestPermissionResponse,
    ToolCallUpdate,
)

PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent

ElicitationAnswer = AcceptElicitationResponse | DeclineElicitationResponse | CancelElicitationResponse
Predicate = Callable[[Any], bool]


@dataclass
class PermissionCall:
    session_id: str
    tool_call: ToolCallUpdate
    options: list[PermissionOption]


@dataclass
class ElicitationCall:
    message: str
    mode: ElicitationMode


@dataclass
class RecordingClient:
    """Records updates; answers permission with ``permission_answer`` (an optionId or "cancelled")."""

    permission_answer: str = "allow_once"
    # When set, permission answers wait for this event (lets a test cancel while a request is open).
    permission_gate: asyncio.Event | None = None
    elicitation_answer: ElicitationAnswer = field(
        default_factory=lambda: AcceptElicitationResponse(action="accept", content={"answer": "teal"})
    )
    updates: list[tuple[str, Any]] = field(default_factory=list)
    permissions: list[PermissionCall] = field(default_factory=list)
    elicitations: list[ElicitationCall] = field(default_factory=list)
    raw_incoming: list[dict[str, Any]] = field(default_factory=list)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    # ---- ACP Client protocol -------------------------------------------------

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))
        self._changed.set()

    async def request_permission(
        self, session_id: str, tool_call: ToolCallUpdate, options: list[PermissionOption], **kwargs: Any
    ) -> RequestPermissionResponse:
        self.permissions.append(PermissionCall(session_id, tool_call, options))
        self._changed.set()
        if self.permission_gate is not None:
            await self.permission_gate.wait()
        if self.permission_answer == "cancelled":
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=self.permission_answer)
        )

    async def create_elicitation(
        self, message: str, mode: ElicitationMode, **kwargs: Any
    ) -> ElicitationAnswer:
        self.elicitations.append(ElicitationCall(message, mode))
        self._changed.set()
        return self.elicitation_answer

    async def complete_elicitation(self, elicitation_id: str, **kwargs: Any) -> None:
        return None

    async def write_text_file(self, *args: Any, **kwargs: Any) -> None:
        raise RequestError.method_not_found("fs/write_text_file")

    async def read_text_file(self, *args: Any, **kwargs: Any) -> Any:
        raise RequestError.method_not_found("fs/read_text_file")

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        raise RequestError.method_not_found(method)

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        return None

    def on_connect(self, conn: Any) -> None:
        return None

    # ---- observing ------------------------------------------------------------

    def observe(self, event: StreamEvent) -> None:
        """Raw wire observer: keeps incoming messages in the exact order they were read."""
        if event.direction is StreamDirection.INCOMING:
            self.raw_incoming.append(event.message)

    def kinds(self, session_id: str | None = None) -> list[str]:
        return [u.session_update for sid, u in self.updates if session_id is None or sid == session_id]

    def of_kind(self, kind: str, session_id: str | None = None) -> list[Any]:
        return [
            u
            for sid, u in self.updates
            if u.session_update == kind and (session_id is None or sid == session_id)
        ]

    def text(self, kind: str = "agent_message_chunk", session_id: str | None = None) -> str:
        return "".join(u.content.text for u in self.of_kind(kind, session_id) if hasattr(u.content, "text"))

    def mark(self) -> int:
        """Index to pass as ``since`` so a wait only considers later updates."""
        return len(self.updates)

    async def wait_for(self, predicate: Predicate, *, since: int = 0, timeout: float = 10.0) -> Any:
        """Wait until an update (from index ``since``) satisfies ``predicate``; return it."""
        async with asyncio.timeout(timeout):
            index = since
            while True:
                while index < len(self.updates):
                    update = self.updates[index][1]
                    index += 1
                    if predicate(update):
                        return update
                self._changed.clear()
                await self._changed.wait()

    async def wait_until(self, condition: Callable[[], bool], *, timeout: float = 10.0) -> None:
        async with asyncio.timeout(timeout):
            while not condition():
                self._changed.clear()
                await self._changed.wait()


@dataclass
class AgentHandle:
    conn: ClientSideConnection
    process: asyncio.subprocess.Process
    client: RecordingClient
    init: InitializeResponse


def default_capabilities(*, elicitation: bool = True) -> ClientCapabilities:
    return ClientCapabilities(
        elicitation=ElicitationCapabilities(form=ElicitationFormCapabilities()) if elicitation else None
    )


@asynccontextmanager
async def demo_agent(
    home: Path,
    *,
    client: RecordingClient | None = None,
    env: Mapping[str, str] | None = None,
    capabilities: ClientCapabilities | None = None,
    stderr: IO[bytes] | None = None,
) -> AsyncIterator[AgentHandle]:
    """Spawn ``python -m runs.demo_agent --home HOME`` and initialize it."""
    client = client or RecordingClient()
    home.mkdir(parents=True, exist_ok=True)
    merged_env = {
        "PYTHONPATH": str(PROJECT_ROOT),
        "HERMESWEB_DEMO_DELAY": "0.001",
        "HERMESWEB_DEMO_AGENT_HOME": str(home),
    }
    merged_env.update(env or {})
    # The agent's stderr goes to a file: an unread pipe can fill up and block it.
    log = stderr or (home / "agent-stderr.log").open("ab")
    try:
        async with spawn_agent_process(
            client,
            sys.executable,
            "-m",
            "runs.demo_agent",
            "--home",
            str(home),
            env=merged_env,
            cwd=str(PROJECT_ROOT),
            transport_kwargs={"stderr": log},
            use_unstable_protocol=True,
            observers=[client.observe],
        ) as (conn, process):
            init = await conn.initialize(
                protocol_version=PROTOCOL_VERSION,
                client_capabilities=capabilities or default_capabilities(),
                client_info=Implementation(name="hermesweb-tests", version="0"),
            )
            yield AgentHandle(conn=conn, process=process, client=client, init=init)
    finally:
        if stderr is None:
            log.close()
