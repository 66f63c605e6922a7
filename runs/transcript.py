"""A run's transcript: its journal folded into the state a browser renders.

Design note: docs/journal.md ("Transcript"). Used by the pages, the admin, exports and
`replay_journal`; the browser's renderer (static/) folds the same events the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from runs.models import EventType, JournalEvent, RunStatus


def materialize(events: Iterable[JournalEvent | dict[str, Any]]) -> dict[str, Any]:
    """Fold a run's events into the state a browser renders.

    `items` keeps the visible order: text and reasoning segments, tool cards,
    plans, approvals, clarify prompts, steer control events and errors. Applying
    the same events twice (a replay overlap) changes nothing: events at or
    below the last applied seq are skipped.
    """
    state: dict[str, Any] = {
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
    for event in events:
        apply_event(state, event)
    return state


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
    if kind == EventType.TOKEN_DELTA:
        delta = payload.get("delta", "")
        state["text"] += delta
        message_id = payload.get("message_id")
        last = items[-1] if items else None
        if last and last["kind"] == "text" and last.get("message_id") == message_id:
            last["text"] += delta
        else:
            items.append({"kind": "text", "message_id": message_id, "text": delta})
    elif kind == EventType.REASONING_DELTA:
        delta = payload.get("delta", "")
        state["reasoning"] += delta
        block_id = payload.get("reasoning_id")
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
        tool_id = payload.get("tool_call_id", "")
        tool = state["tools"].get(tool_id)
        if tool is None:
            tool = {"kind": "tool", "tool_call_id": tool_id, "status": "pending", "content": []}
            state["tools"][tool_id] = tool
            items.append(tool)
        for key in ("title", "tool_kind", "status", "arguments", "locations", "output", "error", "duration"):
            if payload.get(key) is not None:
                tool[key] = payload[key]
        if payload.get("content"):
            tool["content"] = payload["content"]
        if kind == EventType.TOOL_DONE:
            tool["done"] = True
    elif kind == EventType.PLAN_UPDATED:
        state["plan"] = payload.get("entries", [])
        if items and items[-1]["kind"] == "plan":
            items[-1]["entries"] = state["plan"]
        else:
            items.append({"kind": "plan", "entries": state["plan"]})
    elif kind == EventType.APPROVAL_REQUESTED:
        approval = {"kind": "approval", **payload, "resolved": False, "choice": None}
        state["approvals"][payload.get("approval_id")] = approval
        items.append(approval)
    elif kind == EventType.APPROVAL_RESOLVED:
        approval = state["approvals"].get(payload.get("approval_id"))
        if approval is not None:
            approval.update(resolved=True, choice=payload.get("option_id"), outcome=payload.get("outcome"))
    elif kind == EventType.CLARIFY_REQUESTED:
        clarify = {"kind": "clarify", **payload, "resolved": False, "answer": None}
        state["clarifications"][payload.get("clarify_id")] = clarify
        items.append(clarify)
    elif kind == EventType.CLARIFY_RESOLVED:
        clarify = state["clarifications"].get(payload.get("clarify_id"))
        if clarify is not None:
            clarify.update(resolved=True, answer=payload.get("answer"), outcome=payload.get("outcome"))
    elif kind == EventType.STEER_DELIVERED:
        steer = {"kind": "steer", "text": payload.get("text", ""), "intent_id": payload.get("intent_id")}
        state["steers"].append(steer)
        items.append(steer)
    elif kind == EventType.TITLE_UPDATED:
        state["title"] = payload.get("title")
    elif kind == EventType.USAGE_UPDATED:
        state["usage"] = {**state["usage"], **payload}
    elif kind == EventType.USAGE_FINAL:
        state["usage_final"] = payload
    elif kind == EventType.ERROR:
        state["errors"].append(payload)
        items.append({"kind": "error", **payload})
    elif kind in (EventType.STATUS, EventType.RUN_STARTED):
        if payload.get("status"):
            state["status"] = payload["status"]
    elif kind == EventType.PROGRESS:
        state["progress"] = payload.get("text")
    elif kind == EventType.DONE:
        state["terminal"] = True
        state["terminal_state"] = payload.get("state")
        state["status"] = payload.get("state")
        state["stop_reason"] = payload.get("stop_reason")
        if payload.get("reason"):
            state["terminal_reason"] = payload["reason"]
