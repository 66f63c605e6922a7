"""Domain actions for messages and run lifecycle (docs/journal.md, docs/intents.md).

Persist before dispatch: every action commits its rows first and rings the
runner's doorbell only after the commit. Client-generated ids make each
submission idempotent: the same `client_id` on a session yields the first
answer again, with `duplicate=True`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from intents import services as intent_services
from intents.models import PendingIntent
from projects.models import Session, SessionStatus, Workflow
from runs import journal, notify
from runs.journal import NewEvent
from runs.models import ACTIVE_STATUSES, Control, ControlState, JournalEvent, Run, RunSource, RunStatus

MESSAGE_MODES = ("auto", "queue", "steer")


class SubmitRefused(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class SubmitResult:
    kind: str  # "run" | "queue" | "steer"
    run: Run | None
    intent: PendingIntent | None
    status: str
    duplicate: bool

    @property
    def run_id(self) -> int | None:
        return self.run.pk if self.run else None

    @property
    def intent_id(self) -> int | None:
        return self.intent.pk if self.intent else None


def _intent_result(intent: PendingIntent, duplicate: bool) -> SubmitResult:
    # A stop-and-send item was submitted as a queued message: answer in the message's terms.
    kind = "steer" if intent.kind == "steer" else "queue"
    if intent.run_id is not None and kind == "queue":
        # It already drained into a turn: answer with the turn.
        return SubmitResult(kind, intent.run, intent, intent.state, duplicate)
    return SubmitResult(kind, None, intent, intent.state, duplicate)


def _previous_answer(session: Session, client_id: str) -> SubmitResult | None:
    """The answer a first submission of `client_id` got, if there was one."""
    return _answer_given(session, client_id, Run.objects.filter(session=session, client_id=client_id).first())


def _answer_given(session: Session, client_id: str, run: Run | None) -> SubmitResult | None:
    """_previous_answer, the session's run with that client id (or None) already read."""
    intent = PendingIntent.objects.filter(session=session, client_id=client_id).first()
    if intent is not None:
        return _intent_result(intent, duplicate=True)
    if run is not None:
        return SubmitResult("run", run, None, run.status, duplicate=True)
    return None


def lock_session(session_id: int) -> Session:
    """Serialise every decision about one session's turns. Call inside atomic()."""
    return Session.objects.select_for_update().select_related("project").get(pk=session_id)


def do_submit_message(
    session: Session,
    *,
    client_id: str,
    text: str,
    mode: str = "auto",
    attachments: Sequence[dict[str, Any]] | None = None,
    source: str = RunSource.COMPOSER,
    source_meta: dict[str, Any] | None = None,
) -> SubmitResult:
    """Accept a user message: a new turn when the session is idle, else a pending intent.

    While a run is active the explicit `mode` decides, else the project's
    `running_default`: Queue waits for the run to end, Steer is delivered to the
    active run (docs/intents.md).
    """
    if mode not in MESSAGE_MODES:
        raise SubmitRefused("invalid_mode", f"mode must be one of {', '.join(MESSAGE_MODES)}")
    if not text.strip():
        raise SubmitRefused("empty_message", "A message needs some text.")
    try:
        with transaction.atomic():
            locked = lock_session(session.pk)
            # One query for the run this client id may already have made and the active run
            # (each is at most one row): every query is ~1 ms of the way to a first token.
            mine_or_active = Q(client_id=client_id) | Q(status__in=ACTIVE_STATUSES)
            runs = list(Run.objects.filter(mine_or_active, session=locked))
            mine = next((run for run in runs if run.client_id == client_id), None)
            previous = _answer_given(locked, client_id, mine)
            if previous is not None:
                return previous
            if locked.status == SessionStatus.ARCHIVED:
                raise SubmitRefused("session_archived", "This session is archived; unarchive it to send.")
            active = next((run for run in runs if run.status in ACTIVE_STATUSES), None)
            attachments = list(attachments or [])
            if active is None:
                run = Run.objects.create(
                    session=locked,
                    client_id=client_id,
                    prompt_text=text,
                    attachments=attachments,
                    source=source,
                    source_meta=source_meta or {},
                )
                Session.objects.filter(pk=locked.pk).update(updated_at=run.created_at)
                transaction.on_commit(lambda: _announce(locked.pk, run.pk))
                return SubmitResult("run", run, None, run.status, duplicate=False)
            effective = mode if mode != "auto" else locked.project.running_default
            if effective == "steer":
                intent = intent_services.request_steer(
                    locked, active, client_id=client_id, text=text, attachments=attachments
                )
            else:
                intent = intent_services.enqueue(
                    locked,
                    client_id=client_id,
                    text=text,
                    attachments=attachments,
                    source=source,
                    source_meta=source_meta or {},
                )
            return _intent_result(intent, duplicate=False)
    except IntegrityError:
        # Two identical submissions raced past the lookup; the winner's answer stands.
        previous = _previous_answer(session, client_id)
        if previous is None:
            raise
        return previous


def _announce(session_id: int, run_id: int | None) -> None:
    notify.wake_runners("run.queued", run_id)
    notify.publish_session_changed(session_id)


def do_launch_workflow(
    workflow: Workflow, *, session: Session | None, variables: dict[str, str], client_id: str
) -> SubmitResult:
    """Render the workflow's prompt and submit it as a turn (a new session when none is given).

    Raises KeyError (missing variables) or ValueError (bad template) before
    anything is written.
    """
    text = workflow.render(variables)
    meta = {"workflow_id": workflow.pk, "workflow_name": workflow.name, "variables": variables}
    with transaction.atomic():
        if session is None:
            session = Session.objects.filter(project=workflow.project, runs__client_id=client_id).first()
        if session is None:
            session = Session.objects.create(
                project=workflow.project,
                title=workflow.name,
                mode=workflow.agent_mode,
                model=workflow.agent_model,
            )
        return do_submit_message(
            session, client_id=client_id, text=text, mode="queue", source=RunSource.WORKFLOW, source_meta=meta
        )


def finish_run(run_id: int, events: Sequence[NewEvent], **run_updates: Any) -> list[JournalEvent]:
    """Append a run's final events (ending with `done`) and hand the session on.

    In the same transaction as the terminal event: leftover steers become
    queued items and the next waiting intent drains into a new run, so the
    queue drains exactly once whatever crashes afterwards (docs/intents.md).
    """
    session_id = Run.objects.values_list("session_id", flat=True).get(pk=run_id)
    with transaction.atomic():
        # Lock order everywhere: session, then run (append_batch locks the run).
        session = lock_session(session_id)
        rows = journal.append_batch(run_id, events, **run_updates)
        run = Run.objects.get(pk=run_id)
        intent_services.settle_after_run(session, run)
        # Whatever the run never got to apply is answered now, so nothing stays pending forever.
        Control.objects.filter(run_id=run_id, state=ControlState.PENDING).update(
            state=ControlState.REJECTED,
            result="expired",
            message="the run ended first",
            applied_at=timezone.now(),
        )
        next_run = intent_services.drain(session)
        transaction.on_commit(lambda: _announce(session.pk, next_run.pk if next_run else None))
    return rows


def do_mark_interrupted(run: Run, reason: str, *, code: str = "interrupted") -> bool:
    """Give an executing run whose runner is gone its terminal event. Never re-prompts it.

    Returns False when the run already ended (someone else got there first).
    """
    try:
        finish_run(
            run.pk,
            [
                NewEvent("error", {"code": code, "message": reason, "terminal": True}),
                journal.done_event(RunStatus.INTERRUPTED, reason=reason, code=code),
            ],
            error=reason,
        )
    except journal.AlreadyTerminal:
        return False
    return True
