"""A run's transcript: its journal folded into the state a browser renders.

Design note: docs/journal.md ("Transcript"). Used by the pages, the admin, exports and
`replay_journal`. The fold alone: static/js/runstate.js is its twin, kept line for line
(tests/test_browser_runstate.py); pages of turns within a byte budget are runs/transcript_pages.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

from runs.journal import payloads
from runs.models import EventType, JournalEvent, RunStatus

# A tool card's fields, taken from any tool event that carries one (each is declared by
# runs/journal/payloads.py's tool payloads); `content` is taken only when it is not empty.
TOOL_CARD_FIELDS = ("title", "tool_kind", "status", "arguments", "locations", "output", "error", "duration")


def materialize(events: Iterable[JournalEvent | dict[str, Any]]) -> dict[str, Any]:
    """Fold a run's events into the state a browser renders.

    `items` keeps the visible order: text and reasoning segments, tool cards,
    plans, approvals, clarify prompts, steer control events and errors. Applying
    the same events twice (a replay overlap) changes nothing: events at or
    below the last applied seq are skipped.
    """
    fold = Fold()
    for event in events:
        fold.add(event)
    return fold.finish()


class Fold:
    """A state folded event by event, in time linear in the run's text.

    A stream's consecutive deltas are joined once, then applied: `+=` on a dict's string copies
    the whole text each time, which made a long run's fold quadratic (bench/README, round eleven).
    """

    def __init__(self) -> None:
        self.state = empty_state()
        self.stream: list[dict[str, Any]] = []
        self.stream_key: tuple[str, Any] | None = None  # the key of `stream`'s events
        # The run's whole text and reasoning, joined once in `finish`: a tool event between every
        # few deltas would otherwise copy all the text so far each time.
        self.parts: dict[str, list[str]] = {"text": [], "reasoning": []}

    def add(self, event: JournalEvent | dict[str, Any]) -> None:
        ev = _as_dict(event)
        stream = self.stream
        if ev["seq"] <= (stream[-1]["seq"] if stream else self.state["last_seq"]):
            return
        key = _stream_key(ev)
        if stream and key != self.stream_key:
            self._apply_stream()
        if key is not None:
            self.stream.append(ev)
            self.stream_key = key
        else:
            apply_event(self.state, ev)

    def finish(self) -> dict[str, Any]:
        """The state with every event added so far applied."""
        self._apply_stream()
        for key, parts in self.parts.items():
            if parts:
                self.state[key] += "".join(parts)
                parts.clear()
        return self.state

    def _apply_stream(self) -> None:
        stream, self.stream = self.stream, []
        if not stream:
            return
        last = stream[-1]
        if len(stream) > 1:
            delta = "".join((ev.get("payload") or {}).get("delta", "") for ev in stream)
            last = {**last, "payload": {**(last.get("payload") or {}), "delta": delta}}
        key = "text" if last["type"] == EventType.TOKEN_DELTA else "reasoning"
        before, self.state[key] = self.state[key], ""
        apply_event(self.state, last)
        self.parts[key].append(self.state[key])
        self.state[key] = before


def _stream_key(ev: dict[str, Any]) -> tuple[str, Any] | None:
    payload = ev.get("payload") or {}
    if ev["type"] == EventType.TOKEN_DELTA:
        return ("text", payload.get("message_id"))
    if ev["type"] == EventType.REASONING_DELTA:
        return ("reasoning", payload.get("reasoning_id"))
    return None


def empty_state() -> dict[str, Any]:
    return {
        "items": [],
        "text": "",
        "reasoning": "",
        "tools": {},
        "plan": [],
        "approvals": {},
        "clarifications": {},
        "steers": [],
        "title": None,
        "usage": {},
        "usage_final": None,
        "errors": [],
        "status": RunStatus.QUEUED.value,
        "terminal": False,
        "terminal_state": None,
        "stop_reason": None,
        "last_seq": 0,
    }


def _as_dict(event: JournalEvent | dict[str, Any]) -> dict[str, Any]:
    if isinstance(event, JournalEvent):
        return {"seq": event.seq, "type": event.type, "payload": event.payload, "terminal": event.terminal}
    return event


def apply_event(state: dict[str, Any], event: JournalEvent | dict[str, Any]) -> None:
    ev = _as_dict(event)
    if ev["seq"] <= state["last_seq"]:
        return
    state["last_seq"] = ev["seq"]
    kind, payload, items = ev["type"], ev.get("payload") or {}, state["items"]
    # Each branch reads its type's declared payload (runs/journal/payloads.py); `.get` with the
    # default the browser's fold uses, as recorded journals may lack an optional key.
    if kind == EventType.TOKEN_DELTA:
        token = cast(payloads.TokenDelta, payload)
        delta = token.get("delta", "")
        state["text"] += delta
        message_id = token.get("message_id")
        last = items[-1] if items else None
        if last and last["kind"] == "text" and last.get("message_id") == message_id:
            last["text"] += delta
        else:
            items.append({"kind": "text", "message_id": message_id, "text": delta})
    elif kind == EventType.REASONING_DELTA:
        thought = cast(payloads.ReasoningDelta, payload)
        delta = thought.get("delta", "")
        state["reasoning"] += delta
        block_id = thought.get("reasoning_id")
        last = items[-1] if items else None
        if last and last["kind"] == "reasoning" and last.get("reasoning_id") == block_id and not last["done"]:
            last["text"] += delta
        else:
            items.append({"kind": "reasoning", "reasoning_id": block_id, "text": delta, "done": False})
    elif kind == EventType.REASONING_DONE:
        for item in reversed(items):
            if item["kind"] == "reasoning":
                item["done"] = True
                break
    elif kind in (EventType.TOOL_STARTED, EventType.TOOL_UPDATED, EventType.TOOL_DONE):
        call = cast(payloads.ToolPayload, payload)
        tool_id = call.get("tool_call_id", "")
        tool = state["tools"].get(tool_id)
        if tool is None:
            tool = {"kind": "tool", "tool_call_id": tool_id, "status": "pending", "content": []}
            state["tools"][tool_id] = tool
            items.append(tool)
        for key in TOOL_CARD_FIELDS:
            if payload.get(key) is not None:
                tool[key] = payload[key]
        if call.get("content"):
            tool["content"] = call["content"]
        if kind == EventType.TOOL_DONE:
            tool["done"] = True
    elif kind == EventType.PLAN_UPDATED:
        state["plan"] = cast(payloads.PlanUpdated, payload).get("entries", [])
        if items and items[-1]["kind"] == "plan":
            items[-1]["entries"] = state["plan"]
        else:
            items.append({"kind": "plan", "entries": state["plan"]})
    elif kind == EventType.APPROVAL_REQUESTED:
        asked = cast(payloads.ApprovalRequested, payload)
        approval = {"kind": "approval", **asked, "resolved": False, "choice": None}
        state["approvals"][asked.get("approval_id")] = approval
        items.append(approval)
    elif kind == EventType.APPROVAL_RESOLVED:
        chosen = cast(payloads.ApprovalResolved, payload)
        approval = state["approvals"].get(chosen.get("approval_id"))
        if approval is not None:
            approval.update(resolved=True, choice=chosen.get("option_id"), outcome=chosen.get("outcome"))
    elif kind == EventType.CLARIFY_REQUESTED:
        question = cast(payloads.ClarifyRequested, payload)
        clarify = {"kind": "clarify", **question, "resolved": False, "answer": None}
        state["clarifications"][question.get("clarify_id")] = clarify
        items.append(clarify)
    elif kind == EventType.CLARIFY_RESOLVED:
        answered = cast(payloads.ClarifyResolved, payload)
        clarify = state["clarifications"].get(answered.get("clarify_id"))
        if clarify is not None:
            clarify.update(resolved=True, answer=answered.get("answer"), outcome=answered.get("outcome"))
    elif kind == EventType.STEER_DELIVERED:
        steered = cast(payloads.SteerDelivered, payload)
        steer = {"kind": "steer", "text": steered.get("text", ""), "intent_id": steered.get("intent_id")}
        state["steers"].append(steer)
        items.append(steer)
    elif kind == EventType.TITLE_UPDATED:
        state["title"] = cast(payloads.TitleUpdated, payload).get("title")
    elif kind == EventType.USAGE_UPDATED:
        state["usage"] = {**state["usage"], **cast(payloads.UsageUpdated, payload)}
    elif kind == EventType.USAGE_FINAL:
        state["usage_final"] = cast(payloads.UsageFinal, payload)
    elif kind == EventType.TERMINAL_OUTPUT:
        printed = cast(payloads.TerminalOutput, payload)
        terminal_id = printed.get("terminal_id", "")
        # An ACP terminal's id → what it printed (its tool card shows it); made by the first.
        terminals = state.setdefault("terminals", {})
        terminals[terminal_id] = terminals.get(terminal_id, "") + printed.get("delta", "")
    elif kind == EventType.ERROR:
        error = cast(payloads.Error, payload)
        state["errors"].append(error)
        items.append({"kind": "error", **error})
    elif kind == EventType.FILES_RESTORED:
        items.append({"kind": "files_restored", **cast(payloads.FilesRestored, payload)})
    elif kind in (EventType.STATUS, EventType.RUN_STARTED):
        status = cast("payloads.Status | payloads.RunStarted", payload)
        if status.get("status"):
            state["status"] = status["status"]
    elif kind == EventType.PROGRESS:
        state["progress"] = cast(payloads.Progress, payload).get("text")
    elif kind == EventType.DONE:
        done = cast(payloads.Done, payload)
        state["terminal"] = True
        state["terminal_state"] = done.get("state")
        state["status"] = done.get("state")
        state["stop_reason"] = done.get("stop_reason")
        if done.get("reason"):
            state["terminal_reason"] = done["reason"]
