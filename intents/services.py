"""Pending intents: Queue, Steer, Stop-and-send (docs/intents.md).

The queue lives in the database, owned by the session. Every action locks the
session row first (the same lock order as run finishing), so two tabs, two
runners and a dying process cannot both dispatch one item.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max
from django.utils import timezone

from intents.models import IntentKind, IntentState, PendingIntent
from projects.models import Session
from runs import notify
from runs.agents import detected_steer
from runs.messages import NewMessage
from runs.models import Control, ControlKind, Run, Runner, RunSource, RunStatus


@dataclass
class IntentResult:
    status: str  # accepted | duplicate | not_active | expired | unsupported | conflict
    message: str
    intent: PendingIntent


def _changed(session_id: int) -> None:
    notify.publish_on_commit(notify.publish_session_changed, session_id)


def _next_position(session: Session) -> int:
    top = PendingIntent.objects.filter(session=session).open().aggregate(m=Max("position"))["m"]
    return 0 if top is None else top + 1


def enqueue_message(session: Session, message: NewMessage, *, reason: str = "") -> PendingIntent:
    """A waiting Queue item at the end of the session's queue. Caller holds the session lock."""
    intent = PendingIntent.objects.create(
        session=session,
        client_id=message.client_id,
        kind=IntentKind.QUEUE,
        text=message.text,
        attachments=list(message.attachments),
        position=_next_position(session),
        source=message.source,
        source_meta=dict(message.source_meta),
        reason=reason,
    )
    _changed(session.pk)
    return intent


def enqueue(
    session: Session,
    *,
    client_id: str,
    text: str,
    attachments: Sequence[dict[str, Any]] = (),
    source: str = RunSource.COMPOSER,
    source_meta: dict[str, Any] | None = None,
    reason: str = "",
) -> PendingIntent:
    """enqueue_message with the message given field by field (for callers that hold no NewMessage)."""
    message = NewMessage(client_id, text, "queue", tuple(attachments), source, dict(source_meta or {}))
    return enqueue_message(session, message, reason=reason)


def steer_support(session: Session) -> tuple[bool, str]:
    """Whether the session's agent can take steer; the reason when it cannot."""
    agent = settings.HERMESWEB_AGENTS.get(session.project.agent)
    if agent is None:
        return False, f"Agent {session.project.agent!r} is not configured."
    if agent.steer in ("slash", "extension"):
        return True, ""
    if agent.steer == "none":
        return False, f"Agent {agent.name!r} cannot take steer guidance."
    if detected_steer(None, {}, [c.get("name") for c in session.commands or []]) != "none":
        return True, ""  # the session's agent advertised a `steer` command
    for caps in Runner.objects.alive().values_list("agent_capabilities", flat=True):
        if (caps or {}).get(agent.name, {}).get("steer"):
            return True, ""
    return False, f"Agent {agent.name!r} has not advertised steer support."


def _steer_target(session: Session) -> tuple[Run | None, str]:
    active = Run.objects.filter(session=session).active().first()
    if active is None:
        return None, "The run has ended; the message stays queued."
    if active.status == RunStatus.QUEUED:
        return None, "The run has not started yet; the message stays queued."
    if active.status == RunStatus.CANCELLING:
        return None, "The run is being cancelled; the message stays queued."
    ok, why = steer_support(session)
    if not ok:
        return None, f"{why} The message stays queued."
    return active, ""


def _deliver_steer(intent: PendingIntent, run: Run) -> None:
    intent.kind = IntentKind.STEER
    intent.target_run = run
    intent.version += 1
    intent.save(update_fields=["kind", "target_run", "version", "updated_at"])
    Control.objects.create(
        run=run,
        kind=ControlKind.STEER,
        target_id=str(intent.pk),
        # One control per attempt: a steer the runner could not deliver falls back to
        # the queue, and upgrading it again on the same run must not hit the unique key.
        key=f"steer:{intent.pk}:{intent.version}",
        payload={"text": intent.text},
    )
    notify.wake_runners("control", run.pk)


def request_steer(session: Session, active: Run, message: NewMessage) -> PendingIntent:
    """A message sent as Steer. Falls back to Queue, text kept and reason shown, when it cannot steer.

    A steer is recorded as the composer's, whatever `message.source` says.
    """
    target, why = _steer_target(session)
    if target is None:
        fallback = {"requested": "steer", "fallback": why}
        return enqueue_message(
            session, replace(message, source=RunSource.COMPOSER, source_meta=fallback), reason=why
        )
    intent = PendingIntent.objects.create(
        session=session, client_id=message.client_id, kind=IntentKind.QUEUE, text=message.text,
        attachments=list(message.attachments), position=_next_position(session),
    )  # fmt: skip
    _deliver_steer(intent, target)
    _changed(session.pk)
    return intent


def _locked(intent: PendingIntent) -> tuple[Session, PendingIntent]:
    session = Session.objects.lock(intent.session_id)
    return session, PendingIntent.objects.get(pk=intent.pk)


def _waiting_check(intent: PendingIntent, version: int | None) -> IntentResult | None:
    if intent.kind == IntentKind.STEER:
        return IntentResult("not_active", "This message was sent as steer; it can no longer change.", intent)
    if intent.state != IntentState.WAITING or intent.kind != IntentKind.QUEUE:
        return IntentResult("not_active", f"This message is no longer waiting ({intent.state}).", intent)
    if version is not None and version != intent.version:
        return IntentResult("conflict", "The message changed since you saw it.", intent)
    return None


def do_edit_intent(
    intent: PendingIntent, *, version: int, text: str | None = None, position: int | None = None
) -> IntentResult:
    """Edit the text and/or move a waiting Queue item; `version` must be the one the caller saw."""
    with transaction.atomic():
        session, intent = _locked(intent)
        refused = _waiting_check(intent, version)
        if refused:
            return refused
        if text is not None:
            if not text.strip():
                return IntentResult("conflict", "A message needs some text; delete it instead.", intent)
            intent.text = text
        if position is not None:
            _move(session, intent, position)
        intent.version += 1
        intent.save()
        _changed(session.pk)
    return IntentResult("accepted", "Saved.", intent)


def _move(session: Session, intent: PendingIntent, position: int) -> None:
    """Place `intent` at index `position` among the waiting items, renumbering all of them."""
    # Steers in flight are not in the queue the user reorders.
    others = list(
        PendingIntent.objects.filter(session=session, kind=IntentKind.QUEUE)
        .waiting()
        .exclude(pk=intent.pk)
        .order_by("position", "id")
    )
    position = max(0, min(position, len(others)))
    others.insert(position, intent)
    for index, item in enumerate(others):
        if item.pk == intent.pk:
            intent.position = index
        elif item.position != index:
            PendingIntent.objects.filter(pk=item.pk).update(
                position=index, version=F("version") + 1, updated_at=timezone.now()
            )


def do_delete_intent(intent: PendingIntent, *, version: int | None = None) -> IntentResult:
    """Withdraw a waiting Queue item. Delivered steers and dispatched turns cannot be withdrawn."""
    with transaction.atomic():
        session, intent = _locked(intent)
        if intent.state == IntentState.DELETED:
            return IntentResult("duplicate", "Already deleted.", intent)
        refused = _waiting_check(intent, version)
        if refused:
            return refused
        intent.state = IntentState.DELETED
        intent.version += 1
        intent.save()
        _changed(session.pk)
    return IntentResult("accepted", "Deleted.", intent)


def do_steer_intent(intent: PendingIntent, *, run_id: int | None = None) -> IntentResult:
    """Upgrade a waiting Queue item to Steer: irreversible once accepted.

    `run_id` is the run the caller saw running. When it has ended since, the
    guidance was meant for a turn that is over: refused with `conflict`, like a
    run that cannot take steer, and the item stays queued with the reason.
    """
    with transaction.atomic():
        session, intent = _locked(intent)
        if intent.kind == IntentKind.STEER:
            return IntentResult("duplicate", "Already sent as steer.", intent)
        refused = _waiting_check(intent, None)
        if refused:
            return refused
        target, why = _steer_target(session)
        if target is not None and run_id is not None and target.pk != run_id:
            target, why = None, "The run this was meant for has ended; the message stays queued."
        if target is None:
            intent.reason = why
            intent.save(update_fields=["reason", "updated_at"])
            _changed(session.pk)
            return IntentResult("conflict", why, intent)
        intent.reason = ""
        _deliver_steer(intent, target)
        _changed(session.pk)
    return IntentResult("accepted", "Steer sent to the running agent.", intent)


def begin_stop_and_send(
    session: Session, intent: PendingIntent, *, run_id: int | None
) -> IntentResult | None:
    """Mark a waiting Queue item `stopping`: the next turn, once the active run ends.

    Returns the refusal, or None when marked; `intent.target_run` is then the run to
    stop (None: nothing runs). Caller holds the session lock and cancels that run in
    the same transaction (runs.controls.do_stop_and_send); `drain` dispatches stopping
    items first, so a refresh or a dropped socket mid-cancel loses nothing. `run_id` is
    the run the caller meant to stop: when another is active by now, `conflict`.
    """
    if intent.kind == IntentKind.STOP_AND_SEND:
        return IntentResult("duplicate", "Stop-and-send already requested.", intent)
    refused = _waiting_check(intent, None)
    if refused:
        return refused
    if PendingIntent.objects.filter(session=session, state=IntentState.STOPPING).exists():
        # Only one message can be "the next turn": a second one would claim to stop a
        # run that is already stopping, then silently wait behind the first.
        why = "Another message is already replacing the current run; this one stays queued."
        intent.reason = why
        intent.save(update_fields=["reason", "updated_at"])
        _changed(session.pk)
        return IntentResult("conflict", why, intent)
    active = Run.objects.filter(session=session).active().first()
    if run_id is not None and active is not None and active.pk != run_id:
        why = "The run you meant to stop has ended; this message stays queued."
        return IntentResult("conflict", why, intent)
    intent.kind = IntentKind.STOP_AND_SEND
    intent.state = IntentState.STOPPING
    intent.target_run = active
    intent.reason = ""
    intent.version += 1
    intent.save()
    _changed(session.pk)
    return None


def do_steer_delivered(control_id: int, intent_id: int) -> None:
    """The runner handed the steer to the agent: its control accepted, the item delivered.

    Called in the transaction that journals the steer (the runner's writer `also`).
    """
    Control.objects.filter(pk=control_id).record("accepted", "Steer delivered to the agent.")
    intent = PendingIntent.objects.get(pk=intent_id)
    PendingIntent.objects.filter(pk=intent_id).update(
        state=IntentState.DELIVERED, version=intent.version + 1, updated_at=timezone.now()
    )
    _changed(intent.session_id)


def do_steer_failed(control_id: int, intent_id: int, reason: str) -> None:
    """A steer the runner could not deliver falls back to the queue, its text kept and the reason shown."""
    with transaction.atomic():
        intent = PendingIntent.objects.get(pk=intent_id)
        Session.objects.lock(intent.session_id)
        Control.objects.filter(pk=control_id).record("conflict", reason)
        intent.refresh_from_db()
        if intent.state == IntentState.WAITING and intent.kind == IntentKind.STEER:
            intent.kind = IntentKind.QUEUE
            intent.reason = f"{reason} It stays queued for the next turn."
            intent.source_meta = {**intent.source_meta, "steer_failed": reason}
            intent.version += 1
            intent.save()
        _changed(intent.session_id)


def settle_after_run(session: Session, run: Run) -> None:
    """Steers the run never took become queued items, with where they came from.

    They go to the front of the queue, in the order they were sent: they were
    meant for the turn that just ended, so they are the most urgent follow-up.
    Call in the transaction that records the run's terminal event.
    """
    leftovers = list(
        PendingIntent.objects.filter(
            session=session, target_run=run, kind=IntentKind.STEER, state=IntentState.WAITING
        ).order_by("position", "id")
    )
    if not leftovers:
        return
    Control.objects.filter(
        run=run, kind=ControlKind.STEER, target_id__in=[str(i.pk) for i in leftovers]
    ).expire("run ended before delivery")
    queued = list(
        PendingIntent.objects.filter(session=session, kind=IntentKind.QUEUE)
        .waiting()
        .order_by("position", "id")
    )
    for index, intent in enumerate(leftovers):
        intent.kind = IntentKind.QUEUE
        intent.source = RunSource.LEFTOVER_STEER
        intent.source_meta = {**intent.source_meta, "steer_run_id": run.pk}
        intent.reason = "The run ended before this steer reached the agent; it will be sent as the next turn."
        intent.position = index
        intent.version += 1
        intent.save()
    for index, item in enumerate(queued, start=len(leftovers)):
        if item.position != index:
            PendingIntent.objects.filter(pk=item.pk).update(
                position=index, version=F("version") + 1, updated_at=timezone.now()
            )
    _changed(session.pk)


def drain(session: Session) -> Run | None:
    """Turn the next open intent into the session's next run. Caller holds the session lock.

    Stop-and-send items go first, then waiting Queue items by position. The
    intent → run link is one-to-one, so an item dispatches at most once.
    """
    if Run.objects.filter(session=session).active().exists():
        return None
    intent = (
        PendingIntent.objects.filter(session=session, state=IntentState.STOPPING)
        .order_by("updated_at", "id")
        .first()
        or PendingIntent.objects.filter(session=session, kind=IntentKind.QUEUE)
        .waiting()
        .order_by("position", "id")
        .first()
    )
    if intent is None:
        return None
    if intent.kind == IntentKind.STOP_AND_SEND:
        source = RunSource.STOP_AND_SEND
    elif intent.source == RunSource.LEFTOVER_STEER:
        source = RunSource.LEFTOVER_STEER
    else:
        source = RunSource.QUEUE
    run = Run.objects.create(
        session=session,
        client_id=intent.client_id,
        prompt_text=intent.text,
        attachments=intent.attachments,
        source=source,
        source_meta={**intent.source_meta, "intent_id": intent.pk},
    )
    intent.state = IntentState.DISPATCHED
    intent.run = run
    intent.version += 1
    intent.save()
    _changed(session.pk)
    return run


def intent_dict(intent: PendingIntent) -> dict[str, Any]:
    return {
        "id": intent.pk,
        "session_id": intent.session_id,
        "client_id": intent.client_id,
        "kind": intent.kind,
        "state": intent.state,
        "text": intent.text,
        "attachments": intent.attachments,
        "position": intent.position,
        "version": intent.version,
        "source": intent.source,
        "source_meta": intent.source_meta,
        "target_run_id": intent.target_run_id,
        "run_id": intent.run_id,
        "reason": intent.reason,
        "created_at": intent.created_at,
        "updated_at": intent.updated_at,
    }
