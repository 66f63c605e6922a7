"""The per-turn context the scripts drive: streaming, tools, permissions, elicitation, cancel, steer."""

from __future__ import annotations

import asyncio
import os
import re
import time
import uuid
from collections import deque
from collections.abc import Sequence
from typing import Any

from acp.helpers import (
    plan_entry,
    start_tool_call,
    text_block,
    update_agent_message,
    update_agent_thought,
    update_plan,
    update_tool_call,
    update_user_message,
)
from acp.interfaces import Client
from acp.schema import (
    AcceptElicitationResponse,
    AgentPlanUpdate,
    AllowedOutcome,
    CancelElicitationResponse,
    ClientCapabilities,
    ContentToolCallContent,
    DeclineElicitationResponse,
    ElicitationFormSessionMode,
    ElicitationSchema,
    ElicitationStringPropertySchema,
    FileEditToolCallContent,
    PermissionOption,
    PlanEntryStatus,
    TerminalToolCallContent,
    ToolCallLocation,
    ToolCallStatus,
    ToolCallUpdate,
    ToolKind,
)

from .store import SessionStore, StoredSession, now_iso

ToolContent = ContentToolCallContent | FileEditToolCallContent | TerminalToolCallContent
ElicitationAnswer = AcceptElicitationResponse | DeclineElicitationResponse | CancelElicitationResponse

# Permission options, in the order a client should render them (mirrors Hermes' ids and kinds).
PERMISSION_OPTIONS: list[PermissionOption] = [
    PermissionOption(option_id="allow_once", name="Allow once", kind="allow_once"),
    PermissionOption(option_id="allow_always", name="Allow for session", kind="allow_always"),
    PermissionOption(option_id="deny", name="Deny", kind="reject_once"),
    PermissionOption(option_id="deny_always", name="Always deny", kind="reject_always"),
]
_OPTION_KINDS = {option.option_id: option.kind for option in PERMISSION_OPTIONS}

STEER_ACK = "Steer queued for the active turn"
_WORDS_PER_CHUNK = 3
# Files are saved at turn start/end; in between at most this often, so a killed process loses little.
_SAVE_INTERVAL_S = 0.5
_PIECE_RE = re.compile(r"\s*\S+\s*")


class TurnCancelled(Exception):
    """Raised inside a script when the turn must stop with stopReason ``cancelled``."""


def count_words(text: str) -> int:
    return len(text.split())


def split_chunks(text: str, words_per_chunk: int = _WORDS_PER_CHUNK) -> list[str]:
    """Split text into chunks of a few words; joining the chunks gives back the exact text."""
    pieces = _PIECE_RE.findall(text)
    if not pieces:
        return [text] if text else []
    return ["".join(pieces[i : i + words_per_chunk]) for i in range(0, len(pieces), words_per_chunk)]


class LiveSession:
    """A session loaded in this process: its stored record plus in-memory state."""

    def __init__(self, stored: StoredSession) -> None:
        self.stored = stored
        self.turn: Turn | None = None
        # "allow" / "deny" remembered after allow_always / deny_always; per process, like Hermes.
        self.permission_memory: dict[str, str] = {}

    @property
    def session_id(self) -> str:
        return self.stored.session_id


class Turn:
    def __init__(
        self,
        *,
        conn: Client,
        live: LiveSession,
        store: SessionStore,
        prompt_text: str,
        delay: float,
        client_capabilities: ClientCapabilities | None,
    ) -> None:
        self.conn = conn
        self.live = live
        self.store = store
        self.prompt_text = prompt_text
        self.delay = delay
        self.client_capabilities = client_capabilities
        self.cancel_event = asyncio.Event()
        self.steers: deque[str] = deque()
        self.output_words = 0
        self.thought_words = 0
        self._open_tools: set[str] = set()
        self._segment_kind: str | None = None
        self._segment_id: str | None = None
        self._last_save = 0.0

    # ----------------------------------------------------------------- basics

    @property
    def session_id(self) -> str:
        return self.live.session_id

    @property
    def cwd(self) -> str:
        return self.live.stored.cwd

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set()

    def cancel(self) -> None:
        self.cancel_event.set()

    def save(self) -> None:
        self.live.stored.updated_at = now_iso()
        self.store.save(self.live.stored)
        self._last_save = time.monotonic()

    def record_user_prompt(self) -> None:
        """Persist the prompt as a user message; it is only replayed, never echoed live (ACP convention)."""
        update = update_user_message(text_block(self.prompt_text))
        update.message_id = _new_id("user")
        self.live.stored.append(_dump(update))
        self.save()

    async def _send(self, update: Any, *, record: bool = True) -> None:
        await self.conn.session_update(session_id=self.session_id, update=update)
        if record:
            self.record(_dump(update))

    def record(self, update: dict[str, Any]) -> None:
        """Keep a sent update (camelCase JSON) for session/load's replay; saved now and then."""
        self.live.stored.append(update)
        if time.monotonic() - self._last_save > _SAVE_INTERVAL_S:
            self.save()

    def _message_id(self, kind: str) -> str:
        # A new messageId whenever the kind of stream changes (text / thought / after a tool),
        # so clients can split one turn into distinct messages the same way live and on replay.
        if self._segment_kind != kind or self._segment_id is None:
            self._segment_kind = kind
            self._segment_id = _new_id("msg" if kind == "text" else kind)
        return self._segment_id

    def _break_segment(self) -> None:
        self._segment_kind = None
        self._segment_id = None

    async def pause(self, seconds: float) -> None:
        """Sleep, but wake at once on cancel; always yields so notifications get processed."""
        if seconds <= 0:
            await asyncio.sleep(0)
            if self.cancelled:
                raise TurnCancelled
            return
        try:
            await asyncio.wait_for(self.cancel_event.wait(), timeout=seconds)
        except TimeoutError:
            return
        raise TurnCancelled

    async def boundary(self) -> None:
        """Chunk boundary: the only places where cancel is honoured and steers are injected."""
        if self.cancelled:
            raise TurnCancelled
        await self.flush_steers()

    async def flush_steers(self, *, note: str = "Steer received") -> None:
        while self.steers:
            text = self.steers.popleft()
            self._break_segment()
            chunk = f"\n\n> {note}: {text}\n\n"
            update = update_agent_message(text_block(chunk))
            update.message_id = self._message_id("steer")
            self.output_words += count_words(chunk)
            await self._send(update)
            self._break_segment()

    # -------------------------------------------------------------- streaming

    async def say(self, text: str, *, delay: float | None = None) -> None:
        for chunk in split_chunks(text):
            await self.say_chunk(chunk, delay=delay)

    async def say_chunk(self, chunk: str, *, delay: float | None = None) -> None:
        """Send exactly one agent_message_chunk, then wait the per-chunk delay."""
        await self.boundary()
        update = update_agent_message(text_block(chunk))
        update.message_id = self._message_id("text")
        self.output_words += count_words(chunk)
        await self._send(update)
        await self.pause(self.delay if delay is None else delay)

    async def think(self, text: str) -> None:
        for chunk in split_chunks(text):
            await self.boundary()
            update = update_agent_thought(text_block(chunk))
            update.message_id = self._message_id("thought")
            self.thought_words += count_words(chunk)
            await self._send(update)
            await self.pause(self.delay)

    async def plan(self, entries: Sequence[tuple[str, PlanEntryStatus]]) -> None:
        await self.boundary()
        update: AgentPlanUpdate = update_plan(
            plan_entry(content, priority="medium", status=status) for content, status in entries
        )
        await self._send(update)

    # ------------------------------------------------------------------ tools

    async def start_tool(
        self,
        title: str,
        *,
        kind: ToolKind,
        status: ToolCallStatus,
        raw_input: Any = None,
        content: Sequence[ToolContent] | None = None,
        locations: Sequence[ToolCallLocation] | None = None,
    ) -> str:
        await self.boundary()
        self._break_segment()
        tool_call_id = _new_id("call")
        update = start_tool_call(
            tool_call_id,
            title,
            kind=kind,
            status=status,
            raw_input=raw_input,
            content=content,
            locations=locations,
        )
        self._open_tools.add(tool_call_id)
        await self._send(update)
        return tool_call_id

    async def update_tool(
        self,
        tool_call_id: str,
        *,
        status: ToolCallStatus | None = None,
        content: Sequence[ToolContent] | None = None,
        raw_output: Any = None,
        check_boundary: bool = True,
    ) -> None:
        if check_boundary:
            await self.boundary()
        update = update_tool_call(tool_call_id, status=status, content=content, raw_output=raw_output)
        if status in ("completed", "failed"):
            self._open_tools.discard(tool_call_id)
        await self._send(update)

    async def fail_open_tools(self) -> None:
        """Close any tool left running so clients never keep a spinner after the turn ends."""
        for tool_call_id in sorted(self._open_tools):
            await self.update_tool(
                tool_call_id, status="failed", raw_output={"error": "cancelled"}, check_boundary=False
            )

    # ----------------------------------------------------------- permissions

    async def ask_permission(self, tool_call_id: str, title: str, *, memory_key: str) -> bool:
        """Ask the client; True when allowed. A ``cancelled`` outcome or session/cancel ends the turn."""
        remembered = self.live.permission_memory.get(memory_key)
        if remembered is not None:
            return remembered == "allow"
        if memory_key == "write_file" and self.live.stored.mode == "accept_edits":
            return True  # like Hermes' accept_edits: workspace edits run without asking
        await self.boundary()
        request = self.conn.request_permission(
            session_id=self.session_id,
            tool_call=ToolCallUpdate(tool_call_id=tool_call_id, title=title, status="pending"),
            options=list(PERMISSION_OPTIONS),
        )
        response = await self._race_cancel(request)
        outcome = response.outcome
        if not isinstance(outcome, AllowedOutcome):
            raise TurnCancelled
        kind = _OPTION_KINDS.get(outcome.option_id, "reject_once")
        if kind == "allow_always":
            self.live.permission_memory[memory_key] = "allow"
        elif kind == "reject_always":
            self.live.permission_memory[memory_key] = "deny"
        return kind in ("allow_once", "allow_always")

    # ----------------------------------------------------------- elicitation

    def client_supports_form_elicitation(self) -> bool:
        caps = self.client_capabilities
        return caps is not None and caps.elicitation is not None and caps.elicitation.form is not None

    async def elicit_text(
        self, message: str, *, prop: str, title: str, description: str
    ) -> ElicitationAnswer:
        """Ask one required string question (form mode, session scope).

        Raises RequestError when the client refuses the request (e.g. unstable protocol off).
        """
        await self.boundary()
        mode = ElicitationFormSessionMode(
            session_id=self.session_id,
            requested_schema=ElicitationSchema(
                type="object",
                properties={
                    prop: ElicitationStringPropertySchema(type="string", title=title, description=description)
                },
                required=[prop],
            ),
        )
        answer = await self._race_cancel(self.conn.create_elicitation(message=message, mode=mode))
        if isinstance(
            answer, AcceptElicitationResponse | DeclineElicitationResponse | CancelElicitationResponse
        ):
            return answer
        # An unknown action from a newer client: treat like "cancel" rather than guessing.
        return CancelElicitationResponse(action="cancel")

    async def _race_cancel(self, awaitable: Any) -> Any:
        """Await a client request, but stop waiting the moment the turn is cancelled."""
        request = asyncio.ensure_future(awaitable)
        cancelled = asyncio.ensure_future(self.cancel_event.wait())
        try:
            done, _ = await asyncio.wait({request, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for fut in (request, cancelled):
                if not fut.done():
                    fut.cancel()
        if request in done:
            return request.result()
        raise TurnCancelled

    # ----------------------------------------------------------------- crash

    def crash(self, code: int) -> None:
        """Persist what was streamed so far, then die without any cleanup (the ``crash`` script)."""
        self.save()
        os._exit(code)


def _dump(update: Any) -> dict[str, Any]:
    return update.model_dump(mode="json", by_alias=True, exclude_none=True)


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"
