"""Controls on runs: cancel, approval, clarify, goal (docs/runner.md, "Controls").

The web process never touches a live agent: a control is a durable row the
runner applies, plus a doorbell. Every action answers at once with a bounded
ControlResult computed from the database, and is safe to repeat.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from django.db import IntegrityError, transaction

from intents import services as intents
from intents.models import PendingIntent
from projects.models import Session
from projects.refusals import Refused
from runs import journal, notify
from runs.capacity import waiting_of_run
from runs.journal.payloads import ApprovalRequested, Done
from runs.models import (
    Control,
    ControlKind,
    ControlResultStatus,
    EventType,
    JournalEvent,
    Run,
    RunStatus,
)
from runs.turns import finish_run

Status = ControlResultStatus


class InvalidControl(Refused):
    """422: a malformed control."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(422, code, message)


@dataclass
class ControlResult:
    accepted: bool
    status: str
    event_id: str | None
    message: str

    @classmethod
    def of(cls, status: str, message: str, event_id: str | None = None) -> ControlResult:
        return cls(status == Status.ACCEPTED, str(status), event_id, message)


def _ring(run_id: int) -> None:
    notify.wake_runners("control", run_id)


def _lock_run(run_id: int) -> Run:
    return Run.objects.select_for_update().get(pk=run_id)


def do_cancel(run: Run) -> ControlResult:
    """Ask for a graceful cancel; exactly one `done{cancelled}` follows.

    A queued run never reached an agent, so it is cancelled here and now; an
    executing run gets a pending control that its runner applies.
    """
    with transaction.atomic():
        Session.objects.lock(run.session_id)
        locked = _lock_run(run.pk)
        if locked.is_terminal:
            return ControlResult.of(Status.NOT_ACTIVE, f"Run already ended ({locked.status}).")
        if locked.status == RunStatus.QUEUED:
            rows = finish_run(
                locked.pk,
                [
                    journal.done_event(
                        RunStatus.CANCELLED, stop_reason="cancelled", reason="cancelled before start"
                    )
                ],
                stop_reason="cancelled",
            )
            return ControlResult.of(Status.ACCEPTED, "Cancelled before it started.", rows[-1].event_id)
        _, created = Control.objects.get_or_create(
            run=locked, key="cancel", defaults={"kind": ControlKind.CANCEL}
        )
        if not created:
            return ControlResult.of(Status.DUPLICATE, "Cancel already requested.")
        Run.objects.filter(pk=locked.pk).update(status=RunStatus.CANCELLING)
        _ring(locked.pk)
        notify.publish_on_commit(notify.publish_session_changed, locked.session_id)
    return ControlResult.of(Status.ACCEPTED, "Cancel requested.")


def record_result(control_id: int, result: str, message: str) -> None:
    """The runner's answer to one control (its state follows: Control.objects.record)."""
    Control.objects.filter(pk=control_id).record(result, message)


def do_stop_and_send(intent: PendingIntent, *, run_id: int | None = None) -> intents.IntentResult:
    """Cancel the active run and make this waiting item the next turn, exactly once.

    The item is marked `stopping` (intents.services.begin_stop_and_send) in the same
    transaction as the cancel request; the run's terminal event drains it first.
    """
    with transaction.atomic():
        session = Session.objects.lock(intent.session_id)
        intent = PendingIntent.objects.get(pk=intent.pk)
        refused = intents.begin_stop_and_send(session, intent, run_id=run_id)
        if refused is not None:
            return refused
        active = intent.target_run
        # A run that ended meanwhile drained nothing for this item: send it now.
        if active is None or do_cancel(active).status == Status.NOT_ACTIVE:
            intents.drain(session)
            notify.wake_runners("run.queued")
            if active is None:
                return intents.IntentResult("accepted", "Nothing was running; sent now.", intent)
    intent.refresh_from_db()
    return intents.IntentResult("accepted", "Stopping the current run; this message goes next.", intent)


def _journaled(run: Run, event_type: str, id_key: str, target: str) -> JournalEvent | None:
    """The run's first `event_type` event about request `target` (approval or clarify id)."""
    lookup = {f"payload__{id_key}": target}
    return JournalEvent.objects.filter(run=run, type=event_type, **lookup).order_by("seq").first()


def _respond(run: Run, kind: str, target: str, payload: dict[str, Any]) -> ControlResult:
    requested_type, resolved_type, id_key = {
        ControlKind.APPROVAL: (EventType.APPROVAL_REQUESTED, EventType.APPROVAL_RESOLVED, "approval_id"),
        ControlKind.CLARIFY: (EventType.CLARIFY_REQUESTED, EventType.CLARIFY_RESOLVED, "clarify_id"),
    }[kind]
    with transaction.atomic():
        locked = _lock_run(run.pk)
        request = _journaled(locked, requested_type, id_key, target)
        if request is None:
            return ControlResult.of(Status.NOT_ACTIVE, f"No {kind} request {target!r} on this run.")
        if kind == ControlKind.APPROVAL:
            asked = cast(ApprovalRequested, request.payload)
            options = {o.get("option_id") for o in asked.get("options", [])}
            if payload["option_id"] not in options:
                raise InvalidControl(
                    "invalid_option", f"Option must be one of: {', '.join(sorted(options))}."
                )
        key = f"{kind}:{target}"
        existing = Control.objects.filter(run=locked, key=key).first()
        if existing is not None:
            if existing.payload == payload:
                return ControlResult.of(Status.DUPLICATE, "This answer was already given.")
            return ControlResult.of(Status.CONFLICT, "A different answer was already given.")
        resolution = _journaled(locked, resolved_type, id_key, target)
        if resolution is not None or locked.is_terminal:
            return ControlResult.of(Status.EXPIRED, f"The {kind} request is no longer open.")
        try:
            with transaction.atomic():
                Control.objects.create(run=locked, kind=kind, target_id=target, key=key, payload=payload)
        except IntegrityError:
            return ControlResult.of(Status.DUPLICATE, "This answer was already given.")
        _ring(locked.pk)
    return ControlResult.of(Status.ACCEPTED, "Answer sent to the agent.")


def do_respond_approval(run: Run, approval_id: str, option_id: str) -> ControlResult:
    """Answer a pending permission request with one of the options the agent offered."""
    return _respond(run, ControlKind.APPROVAL, approval_id, {"option_id": option_id})


def do_respond_clarify(run: Run, clarify_id: str, answer: dict[str, Any] | str) -> ControlResult:
    """Answer a pending clarify question (an ACP elicitation). A string answers field `answer`."""
    content = {"answer": answer} if isinstance(answer, str) else dict(answer)
    return _respond(run, ControlKind.CLARIFY, clarify_id, {"content": content, "action": "accept"})


GOAL_ACTIONS = ("set", "pause", "resume", "clear", "status", "edit")


def do_goal(session: Session, action: str, text: str | None) -> ControlResult:
    """Goals exist only where the agent offers them; none of ours does (docs/runner.md)."""
    if action not in GOAL_ACTIONS:
        raise InvalidControl("invalid_action", f"action must be one of {', '.join(GOAL_ACTIONS)}")
    if action in ("set", "edit") and not (text or "").strip():
        raise InvalidControl("missing_text", f"goal {action} needs text")
    # ACP v1 has no goal primitive and no configured agent advertises one
    # (Hermes 0.19 has no /goal over ACP): answer honestly rather than emulate it.
    agent = session.project.agent
    return ControlResult.of(Status.UNSUPPORTED, f"Agent {agent!r} does not offer goals.")


def available_controls(run: Run) -> list[str]:
    if run.is_terminal:
        return []
    controls = ["cancel"] if run.status != RunStatus.CANCELLING else []
    if run.status == RunStatus.AWAITING_APPROVAL:
        controls.append("approval")
    if run.status == RunStatus.AWAITING_CLARIFY:
        controls.append("clarify")
    if run.status in (RunStatus.RUNNING, RunStatus.AWAITING_APPROVAL, RunStatus.AWAITING_CLARIFY):
        controls.append("steer")
    return controls


def _open_ids(run: Run, requested: str, resolved: str, key: str) -> list[str]:
    if run.is_terminal:
        return []
    asked = list(
        JournalEvent.objects.filter(run=run, type=requested)
        .order_by("seq")
        .values_list(f"payload__{key}", flat=True)
    )
    done = set(JournalEvent.objects.filter(run=run, type=resolved).values_list(f"payload__{key}", flat=True))
    return [str(i) for i in asked if i not in done]


def run_status(run: Run) -> dict[str, Any]:
    """The reconnect metadata of the run adapter contract (Artifact 1)."""
    terminal_event = None
    if run.is_terminal:
        terminal_event = JournalEvent.objects.filter(run=run, terminal=True).first()
    return {
        "run_id": run.pk,
        "session_id": run.session_id,
        "status": run.status,
        "last_seq": run.last_seq,
        "last_event_id": run.last_event_id,
        "terminal": run.is_terminal,
        "terminal_state": cast(Done, terminal_event.payload).get("state") if terminal_event else None,
        "stop_reason": run.stop_reason or None,
        "controls": available_controls(run),
        "pending_approval_ids": _open_ids(
            run, EventType.APPROVAL_REQUESTED, EventType.APPROVAL_RESOLVED, "approval_id"
        ),
        "pending_clarify_ids": _open_ids(
            run, EventType.CLARIFY_REQUESTED, EventType.CLARIFY_RESOLVED, "clarify_id"
        ),
        "source": run.source,
        "prompt_text": run.prompt_text,
        "error": run.error or None,
        "usage": run.usage or {},
        "network_refused": run.network_refused,
        "waiting": waiting_of_run(run),
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
    }
