"""The journal: append-only, per-run `seq`, exactly one terminal event.

Design note: docs/journal.md. Appends lock the run row (SELECT … FOR UPDATE on
PostgreSQL; SQLite's IMMEDIATE transactions serialise writers), take
`run.last_seq` as the cursor, insert the batch and move `last_seq` in the same
transaction, so seq has neither gaps nor duplicates whoever appends. Events are
published to the channel layer only after the transaction commits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from runs.models import TERMINAL_STATUSES, EventType, JournalEvent, Run, RunStatus
from runs.redaction import redact

TERMINAL_STATES = {s.value for s in TERMINAL_STATUSES}


class JournalError(Exception):
    code = "journal_error"


class AlreadyTerminal(JournalError):
    code = "already_terminal"


class CursorAhead(JournalError):
    code = "cursor_ahead"


class CursorExpired(JournalError):
    code = "cursor_expired"


@dataclass
class NewEvent:
    type: str
    payload: dict[str, Any] = field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        return self.type == EventType.DONE


def done_event(state: str, **payload: Any) -> NewEvent:
    if state not in TERMINAL_STATES:
        raise ValueError(f"terminal state must be one of {sorted(TERMINAL_STATES)}, got {state!r}")
    return NewEvent(EventType.DONE, {"state": state, **payload})


def append(run_id: int, type: str, payload: dict[str, Any] | None = None, **run_updates: Any) -> JournalEvent:
    return append_batch(run_id, [NewEvent(type, payload or {})], **run_updates)[0]


def append_batch(
    run_id: int, events: Sequence[NewEvent], *, publish: bool = True, **run_updates: Any
) -> list[JournalEvent]:
    """Append events atomically and return them with their seq.

    `run_updates` are written to the Run row in the same transaction (status,
    stop_reason, usage …). A `done` event must be last; it sets the run's
    terminal status and finish time, and a second terminal raises AlreadyTerminal.
    """
    if not events:
        return []
    for index, event in enumerate(events):
        if event.terminal and index != len(events) - 1:
            raise ValueError("a done event must be the last of its batch")
    with transaction.atomic():
        run = Run.objects.select_for_update().only("id", "session_id", "status", "last_seq").get(pk=run_id)
        terminal = events[-1] if events[-1].terminal else None
        if run.status in TERMINAL_STATUSES:
            # The terminal event is the last one a run ever gets.
            raise AlreadyTerminal(f"run {run_id} already ended ({run.status})")
        now = timezone.now()
        rows = [
            JournalEvent(
                run_id=run_id,
                seq=run.last_seq + offset,
                type=event.type,
                created_at=now,
                terminal=event.terminal,
                payload=redact(event.payload),
            )
            for offset, event in enumerate(events, start=1)
        ]
        JournalEvent.objects.bulk_create(rows)
        updates: dict[str, Any] = {"last_seq": run.last_seq + len(rows), **run_updates}
        if run.status == RunStatus.CANCELLING and updates.get("status") not in (None, *TERMINAL_STATES):
            # A cancel was requested: only a terminal state may replace it.
            del updates["status"]
        if terminal is not None:
            updates.setdefault("status", terminal.payload["state"])
            updates.setdefault("finished_at", now)
            updates["lease_owner"] = ""
            updates["lease_expires_at"] = None
        Run.objects.filter(pk=run_id).update(**updates)
        if publish:
            session_id = run.session_id
            envelopes = [row.envelope(session_id) for row in rows]
            transaction.on_commit(lambda: _publish(session_id, run_id, envelopes))
    return rows


def _publish(session_id: int, run_id: int, envelopes: list[dict[str, Any]]) -> None:
    from runs import notify

    notify.publish_events(session_id, run_id, envelopes)


def read_after(run: Run, after_seq: int = 0, limit: int | None = None) -> list[JournalEvent]:
    """Events with seq > after_seq, oldest first; raises CursorAhead/CursorExpired."""
    check_cursor(run, after_seq)
    limit = min(limit or settings.HERMESWEB_EVENTS_PAGE_MAX, settings.HERMESWEB_EVENTS_PAGE_MAX)
    return list(JournalEvent.objects.filter(run_id=run.pk, seq__gt=after_seq).order_by("seq")[:limit])


def check_cursor(run: Run, after_seq: int) -> None:
    if after_seq < 0:
        raise CursorAhead(f"cursor {after_seq} is negative")
    if after_seq > run.last_seq:
        raise CursorAhead(f"cursor {after_seq} is beyond run {run.pk}'s last seq {run.last_seq}")
    if 0 < after_seq < run.compacted_through:
        raise CursorExpired(
            f"events of run {run.pk} up to seq {run.compacted_through} were compacted; reload the transcript"
        )


def envelopes(events: Iterable[JournalEvent], session_id: int) -> list[dict[str, Any]]:
    return [event.envelope(session_id) for event in events]


# ---------------------------------------------------------------- materialize


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
