"""The demo agent: ACP request handlers, session bookkeeping, slash commands and turn lifecycle."""

from __future__ import annotations

import asyncio
import base64
import copy
import logging
import math
import os
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

from acp import PROTOCOL_VERSION, RequestError
from acp.helpers import text_block, update_agent_message, update_available_commands
from acp.interfaces import Client
from acp.schema import (
    AgentCapabilities,
    AudioContentBlock,
    AvailableCommand,
    AvailableCommandInput,
    ClientCapabilities,
    CloseSessionResponse,
    Cost,
    CurrentModeUpdate,
    EmbeddedResourceContentBlock,
    ForkSessionResponse,
    ImageContentBlock,
    Implementation,
    InitializeResponse,
    ListSessionsResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PromptCapabilities,
    PromptResponse,
    ResourceContentBlock,
    ResumeSessionResponse,
    SessionCapabilities,
    SessionCloseCapabilities,
    SessionForkCapabilities,
    SessionInfo,
    SessionInfoUpdate,
    SessionListCapabilities,
    SessionNotification,
    SessionResumeCapabilities,
    SetSessionModeResponse,
    StopReason,
    TextContentBlock,
    UnstructuredCommandInput,
    Usage,
    UsageUpdate,
)

from . import AGENT_NAME, __version__, config_options
from .scripts import derive_title, pick_script, wants_fast
from .store import SessionStore, StoredSession, now_iso
from .turn import STEER_ACK, LiveSession, Turn, TurnCancelled, count_words

log = logging.getLogger(__name__)

PromptBlock = (
    TextContentBlock
    | ImageContentBlock
    | AudioContentBlock
    | ResourceContentBlock
    | EmbeddedResourceContentBlock
)
TurnScript = Callable[[Turn], Awaitable[None]]

# The pretend model: a context window, a fixed system-prompt size and a price, so gauges move.
CONTEXT_SIZE = 131_072
BASE_CONTEXT_TOKENS = 1_500
USD_PER_TOKEN = 0.000002
LIST_PAGE_SIZE = 50

# Modes and models, as Hermes reports them (session/new, load, fork): `accept_edits` writes
# without asking. Models are open: any id is taken except `missing-*`, refused (for tests).
MODES = [
    {"id": "default", "name": "Default", "description": "Ask before edits."},
    {"id": "accept_edits", "name": "Accept edits", "description": "Write files without asking."},
]
MODELS = [
    {"modelId": "demo-small", "name": "Demo small"},
    {"modelId": "demo-large", "name": "Demo large"},
]
REFUSED_MODEL_PREFIX = "missing-"

COMMANDS: list[AvailableCommand] = [
    AvailableCommand(name="help", description="List the demo agent's commands and trigger words"),
    AvailableCommand(
        name="steer",
        description="Add guidance to the running turn (on an idle session, runs it as a prompt)",
        input=AvailableCommandInput(root=UnstructuredCommandInput(hint="guidance")),
    ),
    AvailableCommand(
        name="title",
        description="Show or set the session title",
        input=AvailableCommandInput(root=UnstructuredCommandInput(hint="new title")),
    ),
]

HELP_TEXT = (
    "Commands:\n\n"
    "- `/help`: this list\n"
    "- `/steer <guidance>`: inject guidance into the running turn\n"
    "- `/title [text]`: show or set the session title\n\n"
    "Trigger words: `think`, `tool`, `edit`, `approve`/`permission`, `plan`, `ask`/`clarify`, "
    "`slow`, `hold`, `toolloop`, `recall`, `crash`; add `fast` for no typing delay."
)

_COMMAND_RE = re.compile(r"^/(\w+)(?:\s+(.*))?$", re.DOTALL)


def tokens_for(words: int) -> int:
    """The pretend tokenizer: 4 tokens per 3 words, rounded up."""
    return math.ceil(words * 4 / 3)


def prompt_text(prompt: list[PromptBlock]) -> str:
    parts: list[str] = []
    for block in prompt:
        if isinstance(block, TextContentBlock):
            parts.append(block.text)
        elif isinstance(block, ResourceContentBlock):
            parts.append(f"[{block.name}]({block.uri})")
    return "\n".join(parts)


def received_attachments(prompt: list[PromptBlock]) -> list[str]:
    """What the prompt attached, as the demo acknowledges it: `image x.png (image/png, 68 bytes)`."""
    notes: list[str] = []
    for block in prompt:
        if isinstance(block, ImageContentBlock):
            size = len(base64.b64decode(block.data, validate=False))
            notes.append(f"image {_uri_name(block.uri)} ({block.mime_type}, {size} bytes)")
        elif isinstance(block, EmbeddedResourceContentBlock):
            resource = block.resource
            size = len(getattr(resource, "text", "").encode()) or len(getattr(resource, "blob", ""))
            kind = resource.mime_type or "unknown type"
            notes.append(f"file {_uri_name(resource.uri)} ({kind}, {size} bytes)")
        elif isinstance(block, ResourceContentBlock):  # a resource_link: an `@` mention
            notes.append(f"link {block.uri} ({block.mime_type or 'unknown type'})")
    return notes


def _uri_name(uri: str | None) -> str:
    return unquote((uri or "").rstrip("/").rsplit("/", 1)[-1]) or "unnamed"


def parse_command(text: str) -> tuple[str, str] | None:
    match = _COMMAND_RE.match(text.strip())
    if match is None:
        return None
    return match.group(1).lower(), (match.group(2) or "").strip()


class DemoAgent:
    def __init__(self, store: SessionStore, *, delay: float, steer: str = "slash") -> None:
        self._store = store
        self._delay = delay
        # "slash": `/steer text` as a second prompt (Hermes); "extension": the
        # `_session/steering` request codex-acp and claude-agent-acp advertise.
        self._steer = steer
        self._conn: Client | None = None
        self._client_capabilities: ClientCapabilities | None = None
        self._sessions: dict[str, LiveSession] = {}
        # Strong references: the loop keeps only weak ones to tasks.
        self._background: set[asyncio.Task[None]] = set()

    def on_connect(self, conn: Client) -> None:
        self._conn = conn

    @property
    def conn(self) -> Client:
        if self._conn is None:
            raise RuntimeError("agent is not connected")
        return self._conn

    # ------------------------------------------------------------- lifecycle

    async def initialize(
        self,
        protocol_version: int,
        client_capabilities: ClientCapabilities | None = None,
        client_info: Implementation | None = None,
        **kwargs: Any,
    ) -> InitializeResponse:
        self._client_capabilities = client_capabilities
        return InitializeResponse(
            protocol_version=min(protocol_version, PROTOCOL_VERSION),
            agent_capabilities=AgentCapabilities(
                load_session=True,
                # Takes images and embedded text files, and says which it got (attachments).
                prompt_capabilities=PromptCapabilities(image=True, audio=False, embedded_context=True),
                session_capabilities=SessionCapabilities(
                    list=SessionListCapabilities(),
                    resume=SessionResumeCapabilities(),
                    close=SessionCloseCapabilities(),
                    fork=SessionForkCapabilities(),
                ),
            ),
            auth_methods=[],
            agent_info=Implementation(name=AGENT_NAME, title="hermesweb demo agent", version=__version__),
            # Clients detect how steer reaches a running turn from this.
            field_meta={"steer": "slash"}
            if self._steer == "slash"
            else {"_session/steering": {"version": 1}},
        )

    async def new_session(
        self,
        cwd: str,
        additional_directories: list[str] | None = None,
        mcp_servers: list[Any] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        _require_absolute(cwd)
        stamp = now_iso()
        stored = StoredSession(session_id=str(uuid.uuid4()), cwd=cwd, created_at=stamp, updated_at=stamp)
        self._store.save(stored)
        live = LiveSession(stored)
        self._sessions[stored.session_id] = live
        # After the response: the client only knows the session id once session/new has answered.
        self._after_response(self._announce(live, with_state=False))
        return _with_config(NewSessionResponse(session_id=stored.session_id), stored)

    async def load_session(
        self,
        cwd: str,
        session_id: str,
        mcp_servers: list[Any] | None = None,
        additional_directories: list[str] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        live = self._attach(session_id, cwd)
        # ACP: the whole history is replayed before session/load answers.
        live.stored.seal()
        for record in list(live.stored.history):
            try:
                update = SessionNotification.model_validate(
                    {"sessionId": session_id, "update": record}
                ).update
            except ValueError:
                log.warning("skipping unreadable history entry in %s", session_id)
                continue
            await self.conn.session_update(session_id=session_id, update=update)
        await self._announce(live, with_state=True)
        return _with_config(LoadSessionResponse(), live.stored)

    async def resume_session(
        self,
        session_id: str,
        cwd: str,
        additional_directories: list[str] | None = None,
        mcp_servers: list[Any] | None = None,
        **kwargs: Any,
    ) -> ResumeSessionResponse:
        live = self._attach(session_id, cwd)
        self._after_response(self._announce(live, with_state=True))
        return ResumeSessionResponse()

    async def fork_session(
        self,
        session_id: str,
        cwd: str,
        additional_directories: list[str] | None = None,
        mcp_servers: list[Any] | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """A new session whose history (so what `recall` sees) is a copy of `session_id`'s."""
        _require_absolute(cwd)
        source = self._sessions.get(session_id)
        parent = source.stored if source is not None else self._store.load(session_id)
        if parent is None:
            raise RequestError.resource_not_found(session_id)
        parent.seal()
        stamp = now_iso()
        stored = StoredSession(
            session_id=str(uuid.uuid4()),
            cwd=cwd,
            created_at=stamp,
            updated_at=stamp,
            title=parent.title,
            turns=parent.turns,
            context_tokens=parent.context_tokens,
            history=copy.deepcopy(parent.history),
            mode=parent.mode,
            model=parent.model,
        )
        self._store.save(stored)
        live = LiveSession(stored)
        self._sessions[stored.session_id] = live
        self._after_response(self._announce(live, with_state=False))
        return _with_config(ForkSessionResponse(session_id=stored.session_id), stored)

    async def close_session(self, session_id: str, **kwargs: Any) -> CloseSessionResponse:
        live = self._sessions.pop(session_id, None)
        if live is not None and live.turn is not None:
            live.turn.cancel()
        return CloseSessionResponse()

    async def list_sessions(
        self, cwd: str | None = None, cursor: str | None = None, **kwargs: Any
    ) -> ListSessionsResponse:
        sessions = self._store.all()
        if cwd is not None:
            wanted = os.path.normpath(cwd)
            sessions = [s for s in sessions if os.path.normpath(s.cwd) == wanted]
        try:
            start = int(cursor) if cursor else 0
        except ValueError:
            raise RequestError.invalid_params({"cursor": cursor, "details": "unknown cursor"}) from None
        page = sessions[start : start + LIST_PAGE_SIZE]
        end = start + len(page)
        return ListSessionsResponse(
            sessions=[
                SessionInfo(session_id=s.session_id, cwd=s.cwd, title=s.title, updated_at=s.updated_at)
                for s in page
            ],
            next_cursor=str(end) if end < len(sessions) else None,
        )

    async def set_session_mode(self, mode_id: str, session_id: str, **kwargs: Any) -> SetSessionModeResponse:
        live = self._sessions.get(session_id)
        if live is None:
            raise RequestError.resource_not_found(session_id)
        if mode_id not in {m["id"] for m in MODES}:
            raise RequestError.invalid_params({"modeId": mode_id, "details": f"unknown mode {mode_id!r}"})
        live.stored.mode = mode_id
        self._store.save(live.stored)
        return SetSessionModeResponse()

    async def set_model_request(self, params: dict[str, Any]) -> dict[str, Any]:
        """`session/set_model {sessionId, modelId}`, answered by runs/demo_agent/transport.py."""
        session_id, model_id = str(params.get("sessionId") or ""), str(params.get("modelId") or "")
        live = self._sessions.get(session_id)
        if live is None:
            raise RequestError.resource_not_found(session_id)
        if not model_id or model_id.startswith(REFUSED_MODEL_PREFIX):
            raise RequestError.invalid_params({"modelId": model_id, "details": f"no such model {model_id!r}"})
        live.stored.model = model_id
        self._store.save(live.stored)
        return {}

    async def set_config_option(
        self, config_id: str, session_id: str, value: str | bool, **kwargs: Any
    ) -> dict[str, Any]:
        """`session/set_config_option`: the answer is the full set with current values."""
        live = self._sessions.get(session_id)
        if live is None:
            raise RequestError.resource_not_found(session_id)
        live.stored.config = config_options.chosen(live.stored.config, config_id, value)
        self._store.save(live.stored)
        return {"configOptions": config_options.reported(live.stored.config)}

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        live = self._sessions.get(session_id)
        if live is not None and live.turn is not None:
            live.turn.cancel()

    # ---------------------------------------------------------------- prompt

    async def prompt(self, prompt: list[PromptBlock], session_id: str, **kwargs: Any) -> PromptResponse:
        live = self._sessions.get(session_id)
        if live is None:
            raise RequestError.resource_not_found(session_id)
        text = prompt_text(prompt)
        command = parse_command(text)

        if live.turn is not None:
            if command is not None and command[0] == "steer" and command[1]:
                return await self._queue_steer(live, command[1])
            # The workbench owns the queue and must never send this; fail loudly instead of queueing.
            raise RequestError.invalid_request(
                {"details": "a turn is already running in this session; send /steer <text> or session/cancel"}
            )

        if command is not None:
            name, arg = command
            if name == "steer" and arg:
                text, command = arg, None
            elif name == "steer":
                return await self._run_turn(
                    live, text, _reply("Usage: `/steer <guidance>`"), auto_title=False
                )
            elif name == "help":
                return await self._run_turn(live, text, _reply(HELP_TEXT), auto_title=False)
            elif name == "status":
                status = f"Mode: {live.stored.mode} · model: {live.stored.model}"
                status += f" · config: {config_options.describe(live.stored.config)}"
                return await self._run_turn(live, text, _reply(status), auto_title=False)
            elif name == "mode":
                return await self._run_turn(live, text, self._mode_script(live, arg), auto_title=False)
            elif name == "effort":
                script = config_options.effort_script(self.conn, live, arg)
                return await self._run_turn(live, text, script, auto_title=False)
            elif name == "title":
                return await self._run_turn(live, text, self._title_script(live, arg), auto_title=False)
            else:
                reply = f"Unknown command `/{name}`. Try `/help`."
                return await self._run_turn(live, text, _reply(reply), auto_title=False)

        _, script = pick_script(text)
        notes = received_attachments(prompt)
        if notes:
            script = _acknowledging(notes, script)
        delay = 0.0 if wants_fast(text) else self._delay
        return await self._run_turn(live, text, script, auto_title=True, delay=delay)

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """`_session/steering {sessionId, prompt}` → `{outcome: injected | startedNewTurn | failed}`."""
        if method != "session/steering" or self._steer != "extension":
            raise RequestError.method_not_found(f"_{method}")
        live = self._sessions.get(str(params.get("sessionId", "")))
        if live is None:
            raise RequestError.resource_not_found(str(params.get("sessionId")))
        blocks = params.get("prompt") or []
        text = "\n".join(b.get("text", "") for b in blocks if isinstance(b, dict) and b.get("type") == "text")
        if not text.strip():
            return {"outcome": "failed", "reason": "empty guidance"}
        if live.turn is None:
            # No turn to steer: like codex-acp, the guidance would start a new turn. The
            # workbench never relies on that; it reports it and the guidance is not run here.
            return {"outcome": "failed", "reason": "no turn is running"}
        live.turn.steers.append(text)
        return {"outcome": "injected"}

    async def _queue_steer(self, live: LiveSession, steer: str) -> PromptResponse:
        assert live.turn is not None
        live.turn.steers.append(steer)
        # The acknowledgement belongs to this prompt, not to the history of the running turn.
        ack = update_agent_message(text_block(STEER_ACK))
        ack.message_id = f"steer-ack-{uuid.uuid4().hex[:12]}"
        await self.conn.session_update(session_id=live.session_id, update=ack)
        return PromptResponse(
            stop_reason="end_turn", usage=_usage(count_words(steer), count_words(STEER_ACK), 0)
        )

    async def _run_turn(
        self, live: LiveSession, text: str, script: TurnScript, *, auto_title: bool, delay: float = 0.0
    ) -> PromptResponse:
        turn = Turn(
            conn=self.conn,
            live=live,
            store=self._store,
            prompt_text=text,
            delay=delay,
            client_capabilities=self._client_capabilities,
        )
        live.turn = turn
        stored = live.stored
        stored.turns += 1
        stop: StopReason = "end_turn"
        try:
            turn.record_user_prompt()
            if auto_title and stored.title is None:
                stored.title = derive_title(text)
                await self._send_title(live)
            try:
                await script(turn)
            except TurnCancelled:
                stop = "cancelled"
            if stop == "cancelled":
                await turn.fail_open_tools()
            usage = _usage(count_words(text), turn.output_words + turn.thought_words, turn.thought_words)
            stored.context_tokens += usage.total_tokens
            await self._send_usage(live)
            # Steers that arrived after the last chunk boundary still belong to this turn. No await
            # may separate the final emptiness check from clearing live.turn, or a steer could be lost.
            note = "Steer received" if stop == "end_turn" else "Steer not applied (turn cancelled)"
            await turn.flush_steers(note=note)
        finally:
            if live.turn is turn:
                live.turn = None
            turn.save()
        return PromptResponse(stop_reason=stop, usage=usage)

    def _mode_script(self, live: LiveSession, arg: str) -> TurnScript:
        """`/mode <id>`: the agent switches mode itself and says so (`current_mode_update`)."""

        async def script(turn: Turn) -> None:
            if arg not in {m["id"] for m in MODES}:
                await turn.say(f"Unknown mode `{arg}`.", delay=0)
                return
            live.stored.mode = arg
            update = CurrentModeUpdate(session_update="current_mode_update", current_mode_id=arg)
            await self.conn.session_update(session_id=live.session_id, update=update)
            await turn.say(f"Switched to mode {arg}.", delay=0)

        return script

    def _title_script(self, live: LiveSession, arg: str) -> TurnScript:
        async def script(turn: Turn) -> None:
            if arg:
                live.stored.title = arg[:120]
                await self._send_title(live)
                await turn.say(f"Title set to: {live.stored.title}", delay=0)
            else:
                await turn.say(f"Title: {live.stored.title or '(none yet)'}", delay=0)

        return script

    # --------------------------------------------------------------- helpers

    def _attach(self, session_id: str, cwd: str) -> LiveSession:
        live = self._sessions.get(session_id)
        if live is None:
            stored = self._store.load(session_id)
            if stored is None:
                raise RequestError.resource_not_found(session_id)
            live = LiveSession(stored)
            self._sessions[session_id] = live
        if cwd and os.path.isabs(cwd) and cwd != live.stored.cwd:
            # The client says where the session works now; tools write there from here on.
            live.stored.cwd = cwd
            self._store.save(live.stored)
        return live

    def _after_response(self, coro: Awaitable[None]) -> None:
        # The response is queued for sending before this task gets its first step.
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _announce(self, live: LiveSession, *, with_state: bool) -> None:
        try:
            await self.conn.session_update(
                session_id=live.session_id, update=update_available_commands(COMMANDS)
            )
            if with_state:
                if live.stored.title:
                    await self._send_title(live)
                await self._send_usage(live)
        except ConnectionError:
            log.info("client went away before session %s was announced", live.session_id)

    async def _send_title(self, live: LiveSession) -> None:
        update = SessionInfoUpdate(
            session_update="session_info_update", title=live.stored.title, updated_at=now_iso()
        )
        await self.conn.session_update(session_id=live.session_id, update=update)

    async def _send_usage(self, live: LiveSession) -> None:
        context = live.stored.context_tokens
        update = UsageUpdate(
            session_update="usage_update",
            used=min(CONTEXT_SIZE, BASE_CONTEXT_TOKENS + context),
            size=CONTEXT_SIZE,
            cost=Cost(amount=round(context * USD_PER_TOKEN, 6), currency="USD"),
        )
        await self.conn.session_update(session_id=live.session_id, update=update)


def _acknowledging(notes: list[str], script: TurnScript) -> TurnScript:
    async def acknowledged(turn: Turn) -> None:
        await turn.say("".join(f"Received {note}.\n" for note in notes) + "\n", delay=0)
        await script(turn)

    return acknowledged


def _with_config(response: Any, stored: StoredSession) -> dict[str, Any]:
    """A session-opening answer with the session's modes and models (the SDK's models drop `models`)."""
    data: dict[str, Any] = response.model_dump(mode="json", by_alias=True, exclude_none=True)
    data["modes"] = {"currentModeId": stored.mode, "availableModes": MODES}
    data["models"] = {"currentModelId": stored.model, "availableModels": MODELS}
    data["configOptions"] = config_options.reported(stored.config)
    return data


def _reply(text: str) -> TurnScript:
    async def script(turn: Turn) -> None:
        await turn.say(text, delay=0)

    return script


def _usage(input_words: int, output_words: int, thought_words: int) -> Usage:
    input_tokens = tokens_for(input_words)
    output_tokens = tokens_for(output_words)
    return Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=input_tokens + output_tokens,
        thought_tokens=tokens_for(thought_words),
    )


def _require_absolute(cwd: str) -> None:
    if not os.path.isabs(cwd):
        raise RequestError.invalid_params({"cwd": cwd, "details": "cwd must be an absolute path"})
