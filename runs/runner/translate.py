"""ACP `session/update` → journal events: the one translation table.

Design note: docs/runner.md ("Translation"). One Translator per run. It is a
pure function of the updates it has seen, so it is unit-tested without an
agent. Updates arrive as the SDK's pydantic models or as camelCase dicts.
"""

from __future__ import annotations

import re
import time
from typing import Any

from acp import schema

from runs.journal import NewEvent
from runs.journal.payloads import (
    DiffContent,
    PlanEntry,
    PlanUpdated,
    Progress,
    ReasoningDelta,
    ReasoningDone,
    TerminalContent,
    TerminalOutput,
    TextContent,
    TitleUpdated,
    TokenDelta,
    ToolContent,
    ToolDone,
    ToolStarted,
    ToolUpdated,
    UsageUpdated,
)
from runs.models import EventType
from runs.redaction import redact_text
from runs.runner.terminals import JOURNAL_CUT, JOURNAL_LIMIT

# Tool output kept in the journal per update: enough for a card, not a log file.
MAX_TOOL_TEXT = 64 * 1024


_TEXT_CHUNKS = ("agent_message_chunk", "agent_thought_chunk")

# Text chunks that are the agent's notices, not the turn's answer (docs/agents.md, "What Codex
# and Claude do differently"): Codex's warning at every turn for a model it does not know.
NOTICE_TEXT = re.compile(r"\AWarning: Model metadata for .* not found", re.DOTALL)


def is_notice(data: dict[str, Any]) -> bool:
    """A message chunk that is a notice: Claude marks them `_meta.claudeCode.kind`, Codex by its words."""
    meta = data.get("_meta") or {}
    if isinstance(meta.get("claudeCode"), dict) and meta["claudeCode"].get("kind") == "informational":
        return True
    return bool(NOTICE_TEXT.match(text_of(data.get("content"))))


def as_dict(update: Any) -> dict[str, Any]:
    """An ACP model as the JSON the agent sent (camelCase keys, no nulls)."""
    if isinstance(update, dict):
        return update
    # Text chunks are nearly every update of a turn, and model_dump cost more than all the
    # rest of their handling: build the same dict by hand when the chunk is plain text.
    kind = getattr(update, "session_update", None)
    if kind in _TEXT_CHUNKS and update.field_meta is None:
        content = update.content
        if (
            type(content) is schema.TextContentBlock
            and content.annotations is None
            and content.field_meta is None
        ):
            data: dict[str, Any] = {"content": {"text": content.text, "type": "text"}, "sessionUpdate": kind}
            if update.message_id is not None:
                data["messageId"] = update.message_id
            return data
    return update.model_dump(by_alias=True, exclude_none=True, mode="json")


def text_of(content: Any) -> str:
    """The text of an ACP content block (a resource link's URI), or of a list of them."""
    if isinstance(content, dict):
        if content.get("type") == "text":
            return content.get("text", "")
        if content.get("type") == "resource_link":
            return content.get("uri", "")
        return ""
    if isinstance(content, list):
        return "".join(text_of(c) for c in content)
    return ""


def _tool_content(items: list[dict[str, Any]]) -> list[ToolContent]:
    """Keep text, diffs and terminal refs; truncate long text so one tool cannot flood the journal."""
    out: list[ToolContent] = []
    for item in items or []:
        kind = item.get("type")
        if kind == "content":
            text = text_of(item.get("content"))
            if len(text) > MAX_TOOL_TEXT:
                text = redact_text(text)  # before the cut, which could leave half a secret unmasked
            if len(text) > MAX_TOOL_TEXT:
                text = text[:MAX_TOOL_TEXT] + f"\n… [{len(text) - MAX_TOOL_TEXT} characters truncated]"
            out.append(TextContent(type="text", text=text))
        elif kind == "diff":
            out.append(
                DiffContent(
                    type="diff",
                    path=item.get("path"),
                    old_text=item.get("oldText"),
                    new_text=item.get("newText"),
                )
            )
        elif kind == "terminal":
            out.append(TerminalContent(type="terminal", terminal_id=item.get("terminalId")))
    return out


_TOOL_FIELDS = (
    ("title", "title"),
    ("kind", "tool_kind"),
    ("status", "status"),
    ("rawInput", "arguments"),
    ("rawOutput", "output"),
    ("locations", "locations"),
)


def tool_payload(data: dict[str, Any]) -> ToolUpdated:
    """A tool call's fields as the journal keeps them (its content trimmed to text, diffs, terminals).

    `tool.updated`'s payload as it is; `tool.started` adds its status and start time.
    """
    payload: dict[str, Any] = {"tool_call_id": data.get("toolCallId", "")}
    for source, target in _TOOL_FIELDS:
        if data.get(source) is not None:
            payload[target] = data[source]
    if data.get("content") is not None:
        payload["content"] = _tool_content(data["content"])
    return ToolUpdated(**payload)


class Translator:
    def __init__(self) -> None:
        self.open_tools: dict[str, float] = {}
        self.reasoning_open = False
        self.reasoning_index = 0
        self.message_index = 0
        self.last_message_id: str | None = None
        # The segment id given to text from an agent that sends no messageId (Hermes):
        # consecutive chunks share it until any other kind of update arrives.
        self.unnamed_message: str | None = None
        self.title: str | None = None
        self.commands: list[dict[str, Any]] | None = None
        self.usage: UsageUpdated = {}
        self.text_chars = 0
        # Characters journaled per agent-side terminal (Codex's `_meta.terminal_output_delta`).
        self.terminal_chars: dict[str, int] = {}

    def _close_reasoning(self) -> list[NewEvent]:
        if not self.reasoning_open:
            return []
        self.reasoning_open = False
        return [NewEvent(EventType.REASONING_DONE, ReasoningDone(reasoning_id=f"r{self.reasoning_index}"))]

    def translate(self, update: Any) -> list[NewEvent]:
        data = as_dict(update)
        kind = data.get("sessionUpdate")
        if kind != "agent_message_chunk":
            self._break_message()
        handler = getattr(self, f"_on_{kind}", None)
        if handler is None:
            return []  # user_message_chunk (replays), mode/config updates: nothing to journal
        return handler(data)

    def _on_agent_message_chunk(self, data: dict[str, Any]) -> list[NewEvent]:
        text = text_of(data.get("content"))
        events = self._close_reasoning()
        if text and is_notice(data):
            self._break_message()
            return [*events, NewEvent(EventType.PROGRESS, Progress(text=text.strip()))]
        message_id = data.get("messageId")
        if message_id is None:
            if self.unnamed_message is None:
                self.unnamed_message = f"m{self.message_index}"
            message_id = self.unnamed_message
        if message_id != self.last_message_id:
            self.last_message_id = message_id
            self.message_index += 1
        if text:
            self.text_chars += len(text)
            # A literal, not TokenDelta(...): the call costs a text chunk, nearly every update, more.
            delta: TokenDelta = {"message_id": message_id, "delta": text, "content_type": "markdown"}
            events.append(NewEvent(EventType.TOKEN_DELTA, delta))
        return events

    def _break_message(self) -> None:
        if self.unnamed_message is not None:
            self.unnamed_message = None
            self.last_message_id = None

    def _on_agent_thought_chunk(self, data: dict[str, Any]) -> list[NewEvent]:
        text = text_of(data.get("content"))
        if not text:
            return []
        if not self.reasoning_open:
            self.reasoning_open = True
            self.reasoning_index += 1
        delta: ReasoningDelta = {"reasoning_id": f"r{self.reasoning_index}", "delta": text}  # a literal, too
        return [NewEvent(EventType.REASONING_DELTA, delta)]

    def _on_tool_call(self, data: dict[str, Any]) -> list[NewEvent]:
        events = self._close_reasoning()
        payload = tool_payload(data)
        payload.setdefault("status", "pending")
        tool_id = payload["tool_call_id"]
        if tool_id in self.open_tools:
            # A replayed or repeated start: treat as an update.
            return [*events, NewEvent(EventType.TOOL_UPDATED, payload)]
        self.open_tools[tool_id] = time.monotonic()
        started: ToolStarted = {**payload, "status": payload["status"], "started_at": time.time()}
        events.append(NewEvent(EventType.TOOL_STARTED, started))
        events.extend(self._terminal_meta(data))
        if started["status"] in ("completed", "failed"):
            events.append(self._done(tool_id, started["status"]))
        return events

    def _done(self, tool_id: str, status: str, closed_by: str | None = None) -> NewEvent:
        started = self.open_tools.pop(tool_id, None)
        payload = ToolDone(tool_call_id=tool_id, status=status)
        if closed_by is not None:
            payload["closed_by"] = closed_by
        if started is not None:
            payload["duration"] = round(time.monotonic() - started, 3)
        payload["error"] = status == "failed"
        return NewEvent(EventType.TOOL_DONE, payload)

    def _on_tool_call_update(self, data: dict[str, Any]) -> list[NewEvent]:
        events = self._close_reasoning()
        payload = tool_payload(data)
        tool_id = payload["tool_call_id"]
        if tool_id not in self.open_tools:
            # An update for a call we never saw start (or already closed): open it so the card exists.
            self.open_tools[tool_id] = time.monotonic()
            started: ToolStarted = {**payload, "status": payload.get("status", "in_progress")}
            events.append(NewEvent(EventType.TOOL_STARTED, started))
        elif len(payload) > 1:  # more than its id: an update with nothing but `_meta` makes no row
            events.append(NewEvent(EventType.TOOL_UPDATED, payload))
        events.extend(self._terminal_meta(data))
        if payload.get("status") in ("completed", "failed"):
            events.append(self._done(tool_id, payload["status"]))
        return events

    def _terminal_meta(self, data: dict[str, Any]) -> list[NewEvent]:
        """Codex's terminal in `_meta` as the client terminals' `terminal.output` (the card draws it).

        Capped per terminal as runs/runner/terminals.py caps ours; a failed exit is printed last.
        """
        meta = data.get("_meta") or {}
        printed = meta.get("terminal_output_delta") or {}
        exited = meta.get("terminal_exit") or {}
        text = printed.get("data") if isinstance(printed.get("data"), str) else ""
        terminal_id = printed.get("terminal_id") or exited.get("terminal_id") or data.get("toolCallId", "")
        code, signal = exited.get("exit_code"), exited.get("signal")
        if signal:
            text += f"\n[killed by {signal}]\n"
        elif isinstance(code, int) and code != 0:
            text += f"\n[exit code {code}]\n"
        journaled = self.terminal_chars.get(terminal_id, 0)
        if not text or journaled >= JOURNAL_LIMIT:
            return []
        room = JOURNAL_LIMIT - journaled
        piece = text if len(text) <= room else text[:room] + JOURNAL_CUT
        self.terminal_chars[terminal_id] = journaled + len(piece)
        return [NewEvent(EventType.TERMINAL_OUTPUT, TerminalOutput(terminal_id=terminal_id, delta=piece))]

    def _on_plan(self, data: dict[str, Any]) -> list[NewEvent]:
        entries = [
            PlanEntry(
                content=e.get("content", ""),
                priority=e.get("priority", "medium"),
                status=e.get("status", "pending"),
            )
            for e in data.get("entries", [])
        ]
        return [NewEvent(EventType.PLAN_UPDATED, PlanUpdated(entries=entries))]

    def _on_usage_update(self, data: dict[str, Any]) -> list[NewEvent]:
        payload = UsageUpdated(**{k: data[k] for k in ("used", "size", "cost") if data.get(k) is not None})
        self.usage = payload
        return [NewEvent(EventType.USAGE_UPDATED, payload)]

    def _on_session_info_update(self, data: dict[str, Any]) -> list[NewEvent]:
        title = data.get("title")
        if not title:
            return []
        self.title = title
        return [NewEvent(EventType.TITLE_UPDATED, TitleUpdated(title=title, source="agent"))]

    def _on_available_commands_update(self, data: dict[str, Any]) -> list[NewEvent]:
        commands = []
        for command in data.get("availableCommands", []):
            hint = (command.get("input") or {}).get("hint")
            commands.append(
                {
                    "name": command.get("name"),
                    "description": command.get("description", ""),
                    "input_hint": hint,
                }
            )
        self.commands = commands
        return []

    def finish(self, ended: str = "turn_end") -> list[NewEvent]:
        """Close what the agent left open: reasoning, and tool calls it never completed (Hermes).

        At a turn's normal end such a call is done (Hermes never completes some tools); a
        turn that was cancelled or failed interrupted it, so it closes as failed.
        """
        events = self._close_reasoning()
        status = "completed" if ended == "turn_end" else "failed"
        for tool_id in list(self.open_tools):
            events.append(self._done(tool_id, status, closed_by=ended))
        return events


def per_turn_usage(
    response_usage: dict[str, Any] | None, previous_total: dict[str, Any] | None, cumulative: bool
) -> dict[str, Any]:
    """Per-turn token usage; for agents reporting a running session total, the difference."""
    usage = dict(response_usage or {})
    if not cumulative or not previous_total:
        return usage
    if any(
        isinstance(value, (int, float)) and isinstance(previous_total.get(key), (int, float))
        and value < previous_total[key]
        for key, value in usage.items()
    ):  # fmt: skip
        # A total below the last one restarted with a fresh agent process (after session/load).
        return usage
    turn: dict[str, Any] = {}
    for key, value in usage.items():
        before = previous_total.get(key)
        turn[key] = (
            value - before if isinstance(value, (int, float)) and isinstance(before, (int, float)) else value
        )
    return turn
