"""The agent's questions to the user during a turn: permission requests and elicitations.

Design note: docs/runner.md ("Controls"). Each open ACP request is a future the agent's
call awaits. It is journaled (`approval.requested` / `clarify.requested`) and answered
from an approval or clarify Control after the answer's event is committed, in the
transaction that records the control's result. Nothing is ever granted on the user's
behalf: a request nobody answers stays open until the turn ends, and is then answered
`cancelled`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

from acp import schema
from asgiref.sync import sync_to_async

from runs.controls import record_result
from runs.journal import NewEvent
from runs.journal.payloads import (
    ApprovalOption,
    ApprovalRequested,
    ApprovalResolved,
    ClarifyRequested,
    ClarifyResolved,
    Status,
)
from runs.models import Control, EventType, RunStatus
from runs.runner.translate import as_dict, tool_payload
from runs.runner.writer import JournalWriter


def denied() -> schema.RequestPermissionResponse:
    return schema.RequestPermissionResponse(outcome=schema.DeniedOutcome(outcome="cancelled"))


def declined() -> schema.CancelElicitationResponse:
    return schema.CancelElicitationResponse(action="cancel")


class AgentRequests:
    """One run's open permission requests and elicitations."""

    def __init__(self, writer: JournalWriter, cancelling: asyncio.Event, opened: Callable[[], None]) -> None:
        self.writer = writer
        self.cancelling = cancelling  # the run is being cancelled: refuse new requests
        self.opened = opened  # a request was journaled: its answer may already be waiting
        self.approvals: dict[str, tuple[asyncio.Future[Any], ApprovalRequested]] = {}
        self.clarifications: dict[str, asyncio.Future[Any]] = {}

    async def permission(self, tool_call: Any, options: list[Any]) -> schema.RequestPermissionResponse:
        if self.cancelling.is_set():
            return denied()
        approval_id = f"ap-{uuid.uuid4().hex[:12]}"
        call = as_dict(tool_call)
        payload = ApprovalRequested(
            approval_id=approval_id,
            tool_call_id=call.get("toolCallId"),
            title=call.get("title") or "Permission requested",
            tool_kind=call.get("kind"),
            arguments=call.get("rawInput"),
            content=tool_payload(call).get("content", []),
            options=[ApprovalOption(option_id=o.option_id, name=o.name, kind=o.kind) for o in options],
        )
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.approvals[approval_id] = (future, payload)
        await self.writer.flush(
            [
                NewEvent(EventType.APPROVAL_REQUESTED, payload),
                NewEvent(EventType.STATUS, Status(status=RunStatus.AWAITING_APPROVAL)),
            ],
            status=RunStatus.AWAITING_APPROVAL,
        )
        self.opened()
        return await future

    async def elicitation(self, message: str, mode: Any) -> Any:
        if self.cancelling.is_set():
            return declined()
        clarify_id = f"cl-{uuid.uuid4().hex[:12]}"
        requested = getattr(mode, "requested_schema", None)
        schema_dict = requested.model_dump(by_alias=True, exclude_none=True, mode="json") if requested else {}
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.clarifications[clarify_id] = future
        await self.writer.flush(
            [
                NewEvent(
                    EventType.CLARIFY_REQUESTED,
                    ClarifyRequested(
                        clarify_id=clarify_id,
                        question=message,
                        schema=schema_dict,
                        input_mode="form" if schema_dict else "text",
                    ),
                ),
                NewEvent(EventType.STATUS, Status(status=RunStatus.AWAITING_CLARIFY)),
            ],
            status=RunStatus.AWAITING_CLARIFY,
        )
        self.opened()
        return await future

    async def answer_approval(self, control: Control) -> None:
        """Journal the user's choice (and record the control with it), then answer the agent."""
        entry = self.approvals.get(control.target_id)
        if entry is None or entry[0].done():
            await sync_to_async(record_result)(
                control.pk, "expired", "The approval request is no longer open."
            )
            return
        future, _ = entry
        option_id = control.payload["option_id"]
        status = self._status_after(approval=control.target_id)
        resolved = ApprovalResolved(approval_id=control.target_id, option_id=option_id, outcome="selected")
        await self._journal_answer(control, NewEvent(EventType.APPROVAL_RESOLVED, resolved), status)
        del self.approvals[control.target_id]
        future.set_result(
            schema.RequestPermissionResponse(
                outcome=schema.AllowedOutcome(outcome="selected", option_id=option_id)
            )
        )

    async def _journal_answer(self, control: Control, resolved: NewEvent, status: str) -> None:
        """The answer's event and the run's status, with the control's result in the same transaction."""
        await self.writer.flush(
            [resolved, NewEvent(EventType.STATUS, Status(status=status))],
            also=lambda: record_result(control.pk, "accepted", "Answer delivered."),
            status=status,
        )

    async def answer_clarify(self, control: Control) -> None:
        """Journal the user's answer (and record the control with it), then answer the agent."""
        future = self.clarifications.get(control.target_id)
        if future is None or future.done():
            await sync_to_async(record_result)(control.pk, "expired", "The question is no longer open.")
            return
        content = control.payload.get("content") or {}
        status = self._status_after(clarify=control.target_id)
        resolved = ClarifyResolved(clarify_id=control.target_id, answer=content, outcome="accepted")
        await self._journal_answer(control, NewEvent(EventType.CLARIFY_RESOLVED, resolved), status)
        del self.clarifications[control.target_id]
        future.set_result(schema.AcceptElicitationResponse(action="accept", content=content))

    def cancel_all(self, why: str) -> list[NewEvent]:
        """Answer every open request `cancelled`; the events that journal each resolution."""
        events = []
        for approval_id, (future, _) in list(self.approvals.items()):
            if not future.done():
                future.set_result(denied())
                events.append(
                    NewEvent(
                        EventType.APPROVAL_RESOLVED,
                        ApprovalResolved(approval_id=approval_id, outcome="cancelled", reason=why),
                    )
                )
        for clarify_id, future in list(self.clarifications.items()):
            if not future.done():
                future.set_result(declined())
                events.append(
                    NewEvent(
                        EventType.CLARIFY_RESOLVED,
                        ClarifyResolved(clarify_id=clarify_id, outcome="cancelled", reason=why),
                    )
                )
        self.approvals.clear()
        self.clarifications.clear()
        return events

    def refuse_all(self) -> None:
        """Answer every open request `cancelled` without journaling: the run is no longer ours."""
        for future, _ in self.approvals.values():
            if not future.done():
                future.set_result(denied())
        for future in self.clarifications.values():
            if not future.done():
                future.set_result(declined())

    def _status_after(self, approval: str = "", clarify: str = "") -> str:
        """The run's status once the request named here is answered."""
        if any(k != approval for k in self.approvals):
            return RunStatus.AWAITING_APPROVAL
        if any(k != clarify for k in self.clarifications):
            return RunStatus.AWAITING_CLARIFY
        return RunStatus.RUNNING
