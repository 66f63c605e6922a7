"""Actions on triggers and firings (design note: docs/automations.md).

Views parse and authorize; these `do_*` functions validate, mutate and launch. Each states its
preconditions. They raise `projects.services.InvalidInput` (422) for input that cannot be a
trigger, never HTTP errors. A firing launches its workflow through
`runs.services.do_launch_workflow`, the action `POST /api/workflows/{id}/launch` uses, so every
rule of a launch (caps, archived projects, template bounds, the session's turn lock) holds.
"""

from __future__ import annotations

import logging
import math
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from automations import schedule
from automations.models import (
    SECRET_PREFIX,
    Firing,
    FiringOutcome,
    MissedPolicy,
    OverlapPolicy,
    Trigger,
    TriggerKind,
    hash_secret,
)
from projects.models import Session, Workflow
from projects.prompts import TemplateLimit
from projects.services import Conflict, InvalidInput, do_apply_workflow_settings
from runs.controls import do_cancel, do_respond_approval
from runs.models import Control, EventType, JournalEvent, Run, RunStatus
from runs.services import SubmitRefused, do_launch_workflow

log = logging.getLogger(__name__)

# A body field becomes a template variable only under a name a template can use.
_VARIABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,99}$")
RATE_WINDOW = timedelta(seconds=60)


class RateLimited(Exception):
    """A webhook past HERMESWEB_WEBHOOK_RATE_PER_MINUTE: try again in `retry_after` seconds (a 429)."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"Too many calls of this webhook; try again in {retry_after} s.")
        self.retry_after = retry_after


@dataclass(frozen=True)
class Created:
    trigger: Trigger
    secret: str | None  # a webhook's raw secret: shown once, never stored


# ---------------------------------------------------------------- validation


def _invalid(exc: schedule.InvalidSchedule) -> InvalidInput:
    return InvalidInput(exc.code, exc.message, exc.field)


def clean_schedule(cron: str, tz: str, at: datetime | None, now: datetime) -> datetime | None:
    """The first planned time of a schedule: cron (in zone `tz`) xor `at` (in the future).

    InvalidInput `invalid_schedule` / `invalid_timezone` with the reason.
    """
    try:
        schedule.zone(tz)
        if bool(cron) == (at is not None):
            raise schedule.InvalidSchedule(
                "invalid_schedule", "A schedule has either `cron` or `at`, not both and not neither.", "cron"
            )
        if at is not None:
            if at.tzinfo is None:
                raise schedule.InvalidSchedule(
                    "invalid_schedule", "`at` needs a time zone offset (e.g. 2026-12-08T09:00:00Z).", "at"
                )
            if at <= now:
                raise schedule.InvalidSchedule("invalid_schedule", "`at` is in the past.", "at")
            return at
        schedule.check_cron(cron, tz)
        return schedule.next_after(cron, tz, now)
    except schedule.InvalidSchedule as exc:
        raise _invalid(exc) from None


def clean_variables(variables: dict[str, Any]) -> dict[str, str]:
    for name in variables:
        if not _VARIABLE.match(name):
            raise InvalidInput("validation_error", f"{name!r} is not a template variable name.", "variables")
    return {name: str(value) for name, value in variables.items()}


def clean_session(session: Session | None, workflow: Workflow) -> Session | None:
    if session is not None and session.project_id != workflow.project_id:
        raise InvalidInput(
            "wrong_project", "The session belongs to another project than the workflow.", "session"
        )
    return session


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


# ---------------------------------------------------------------- triggers


def do_create_trigger(
    workflow: Workflow,
    *,
    kind: str,
    cron: str = "",
    timezone_name: str = "",
    at: datetime | None = None,
    missed: str = MissedPolicy.SKIP,
    overlap: str = OverlapPolicy.SKIP,
    variables: dict[str, Any] | None = None,
    session: Session | None = None,
    enabled: bool = True,
    approval_timeout_seconds: int | None = None,
) -> Created:
    """A schedule (its first planned time computed now) or a webhook (a new secret, returned once).

    Preconditions: `workflow` and `session` are the caller's (the view checked). InvalidInput
    `invalid_schedule` / `invalid_timezone` for a schedule that cannot run.
    """
    fields: dict[str, Any] = {
        "workflow": workflow,
        "kind": kind,
        "missed": missed,
        "overlap": overlap,
        "variables": clean_variables(variables or {}),
        "session": clean_session(session, workflow),
        "enabled": enabled,
        "approval_timeout_seconds": approval_timeout_seconds,
    }
    secret = None
    if kind == TriggerKind.SCHEDULE:
        first = clean_schedule(cron, timezone_name, at, timezone.now())
        fields.update(cron=cron, timezone=timezone_name, at=at, next_fire_at=first if enabled else None)
    else:
        if cron or at is not None:
            raise InvalidInput(
                "invalid_schedule", "A webhook fires when called; it takes no schedule.", "cron"
            )
        secret = new_secret()
        fields["secret_digest"] = hash_secret(secret)
    return Created(Trigger.objects.create(**fields), secret)


def do_update_trigger(trigger: Trigger, **changes: Any) -> Trigger:
    """Change `enabled`, the schedule (`cron`, `timezone_name`, `at`), `missed`, `overlap`, `variables`.

    A new schedule or a re-enabled trigger plans from now: times that passed while it was off
    are not missed, they were never planned. Preconditions: the caller owns the trigger.
    """
    now = timezone.now()
    with transaction.atomic():
        trigger = Trigger.objects.select_for_update().get(pk=trigger.pk)
        replan = False
        if trigger.kind == TriggerKind.SCHEDULE and {"cron", "timezone_name", "at"} & changes.keys():
            cron = changes.get("cron", trigger.cron)
            at = changes.get("at", trigger.at)
            if "cron" in changes and "at" not in changes:
                at = None
            if "at" in changes and "cron" not in changes:
                cron = ""
            tz = changes.get("timezone_name", trigger.timezone)
            clean_schedule(cron, tz, at, now)
            trigger.cron, trigger.timezone, trigger.at = cron, tz, at
            replan = True
        for name in ("missed", "overlap", "approval_timeout_seconds"):
            if name in changes:
                setattr(trigger, name, changes[name])
        if "variables" in changes:
            trigger.variables = clean_variables(changes["variables"])
        if "enabled" in changes and changes["enabled"] != trigger.enabled:
            trigger.enabled = changes["enabled"]
            replan = True
        if replan:
            trigger.next_fire_at = first_time(trigger, now) if trigger.enabled else None
        trigger.save()
    return trigger


def first_time(trigger: Trigger, now: datetime) -> datetime | None:
    """The next planned time from `now`: a one-shot's instant unless it already fired."""
    if trigger.kind != TriggerKind.SCHEDULE:
        return None
    if trigger.at is not None:
        done = Firing.objects.filter(trigger=trigger, planned_at=trigger.at).exists()
        return None if done else trigger.at
    return schedule.next_after(trigger.cron, trigger.timezone, now)


def do_rotate_secret(trigger: Trigger) -> str:
    """A new secret for a webhook; the old URL answers 404 from the commit on. Returned once."""
    if trigger.kind != TriggerKind.WEBHOOK:
        raise InvalidInput("not_a_webhook", "Only a webhook trigger has a secret.")
    secret = new_secret()
    Trigger.objects.filter(pk=trigger.pk).update(secret_digest=hash_secret(secret), updated_at=timezone.now())
    return secret


def do_delete_trigger(trigger: Trigger) -> None:
    """Delete the trigger and its firings; sessions and runs it launched stay."""
    trigger.delete()


# ---------------------------------------------------------------- firing


def tick(now: datetime | None = None, *, fired_by: str = "") -> list[Firing]:
    """One pass of the scheduler: fire what is due, then deny approvals past their timeout."""
    now = now or timezone.now()
    fired = fire_due(now, fired_by=fired_by)
    deny_expired_approvals(now)
    return fired


def fire_due(now: datetime | None = None, *, fired_by: str = "", limit: int = 100) -> list[Firing]:
    """Fire every due schedule (at most `limit` this call): what the scheduler calls each tick."""
    now = now or timezone.now()
    due = Trigger.objects.due(now).order_by("next_fire_at").values_list("pk", "next_fire_at")[:limit]
    fired = []
    for pk, planned in list(due):
        firing = do_fire_planned(pk, planned, now=now, fired_by=fired_by)
        if firing is not None:
            fired.append(firing)
    return fired


def do_fire_planned(
    trigger_id: int, planned: datetime, *, now: datetime, fired_by: str = ""
) -> Firing | None:
    """Decide the trigger's planned time `planned` once: launched, skipped or failed; None if
    another process decided it first (or the trigger moved on, or was disabled).

    One transaction: the trigger row is locked, its cursor advanced, the Firing inserted (the
    unique (trigger, planned_at) refuses a second) and the workflow launched — all or nothing, so
    a process that dies midway leaves the time to the next scheduler. A time more than
    HERMESWEB_AUTOMATION_MISSED_SECONDS late was missed (no scheduler ran): recorded
    `skipped_missed`, or launched once with `missed: run_once`; the cursor moves past it.
    """
    grace = timedelta(seconds=settings.HERMESWEB_AUTOMATION_MISSED_SECONDS)
    try:
        with transaction.atomic():
            trigger = (
                Trigger.objects.select_for_update(of=("self",))
                .select_related("workflow__project", "session")
                .filter(pk=trigger_id, enabled=True, next_fire_at=planned)
                .first()
            )
            if trigger is None:
                return None
            late = now - planned > grace
            following = None
            if trigger.cron:
                following = schedule.next_after(trigger.cron, trigger.timezone, max(planned, now - grace))
            Trigger.objects.filter(pk=trigger.pk).update(next_fire_at=following)
            firing = Firing.objects.create(trigger=trigger, planned_at=planned, fired_by=fired_by[:200])
            if late:
                passed = (
                    schedule.count_between(trigger.cron, trigger.timezone, planned, now - grace)
                    if trigger.cron
                    else 0
                )
                why = f"no scheduler was running at {planned.isoformat()}" + (
                    f" nor at {passed} later time(s)" if passed else ""
                )
                if trigger.missed != MissedPolicy.RUN_ONCE:
                    firing.settle(FiringOutcome.SKIPPED_MISSED, why)
                    return firing
                launch(firing, trigger, dict(trigger.variables), note=f"late: {why}")
            else:
                launch(firing, trigger, dict(trigger.variables))
            return firing
    except IntegrityError:
        return None  # the unique (trigger, planned_at): another process recorded this time


def do_fire_webhook(raw_secret: str, body: dict[str, Any], *, fired_by: str = "web") -> Firing:
    """Fire the enabled webhook whose secret is `raw_secret` with `body`'s fields as variables.

    Trigger.DoesNotExist for an unknown, rotated-away or disabled secret; RateLimited past
    HERMESWEB_WEBHOOK_RATE_PER_MINUTE calls in the last minute (counted under the trigger's
    row lock, so concurrent calls cannot all pass one count). A firing that could not launch
    is recorded `failed` and returned (its reason starts with the code).
    """
    limit = settings.HERMESWEB_WEBHOOK_RATE_PER_MINUTE
    with transaction.atomic():
        trigger = (
            Trigger.objects.for_secret(raw_secret)
            .enabled()
            .select_for_update(of=("self",))
            .select_related("workflow__project", "session")
            .first()
        )
        if trigger is None:
            raise Trigger.DoesNotExist
        now = timezone.now()
        recent = list(
            Firing.objects.recent_for(trigger.pk, now - RATE_WINDOW)
            .order_by("planned_at")
            .values_list("planned_at", flat=True)
        )
        if len(recent) >= limit:
            wait = (recent[-limit] + RATE_WINDOW - now).total_seconds()
            raise RateLimited(max(1, math.ceil(wait)))
        # Two calls in one microsecond still get a planned time each.
        planned = max([now, *(t + timedelta(microseconds=1) for t in recent[-1:])])
        firing = Firing.objects.create(trigger=trigger, planned_at=planned, fired_by=fired_by)
        launch(firing, trigger, {**trigger.variables, **body_variables(body)})
    return firing


def body_variables(body: dict[str, Any]) -> dict[str, str]:
    """A webhook body's fields as template variables: data, never template.

    Each top-level field with a plain name is a variable (a string as it is, anything else as
    JSON); `body` is the whole body as JSON unless a field takes that name. str.format inserts
    values in one pass, so braces or format specs inside a value stay literal text.
    """
    values = {
        key: value if isinstance(value, str) else orjson.dumps(value).decode()
        for key, value in body.items()
        if _VARIABLE.match(key)
    }
    values.setdefault("body", orjson.dumps(body).decode())
    return values


def active_run_of(trigger: Trigger) -> Run | None:
    """A run some firing of `trigger` launched that is still queued or executing."""
    return Run.objects.active().filter(automation_firings__trigger=trigger).select_related("session").first()


def launch(firing: Firing, trigger: Trigger, variables: dict[str, str], *, note: str = "") -> None:
    """Launch the trigger's workflow for `firing` (pending) and settle it. Call inside atomic(),
    holding the trigger's row lock.

    Overlap: while a run of this trigger is active, the firing is `skipped_overlap`, or with
    `overlap: queue` it is queued behind that run in its session (a pending intent). Otherwise a
    new session in the workflow's project, or the trigger's fixed session (a queued turn there if
    it is busy). The firing's id is the launch's client id: launching it again is a duplicate.
    """
    workflow = trigger.workflow
    session = trigger.session
    busy = active_run_of(trigger)
    if busy is not None:
        if trigger.overlap != OverlapPolicy.QUEUE:
            firing.settle(FiringOutcome.SKIPPED_OVERLAP, f"run {busy.pk} of this trigger is still active")
            return
        session = busy.session
    try:
        with transaction.atomic():
            if session is not None:
                session = do_apply_workflow_settings(session, workflow)
            result = do_launch_workflow(
                workflow, session=session, variables=variables, client_id=f"automation-firing-{firing.pk}"
            )
    except KeyError as exc:
        missing = str(exc.args[0]) if exc.args else ""
        firing.settle(FiringOutcome.FAILED, f"missing_variables: the template needs {missing}")
        return
    except (TemplateLimit, SubmitRefused, Conflict, InvalidInput) as exc:
        firing.settle(FiringOutcome.FAILED, f"{exc.code}: {exc.message}")
        return
    except ValueError as exc:
        firing.settle(FiringOutcome.FAILED, f"invalid_template: {exc}")
        return
    owner = result.run or result.intent
    assert owner is not None
    firing.settle(
        FiringOutcome.LAUNCHED,
        note,
        session_id=owner.session_id,
        run=result.run,
        intent=result.intent,
    )


def failure_code(firing: Firing) -> str:
    """The code a failed firing's reason starts with."""
    return firing.reason.partition(":")[0] or "failed"


# ---------------------------------------------------------------- unattended approvals


def deny_expired_approvals(now: datetime | None = None) -> int:
    """Deny the permission requests that wait past their trigger's `approval_timeout_seconds`.

    Only runs a firing launched, only triggers that set a timeout. Each open request is answered
    with the agent's reject option (`reject_once` first), through the same control a person's
    answer takes (runs.controls.do_respond_approval); with no reject option offered the turn is
    cancelled. Never an allow: unattended does not mean more power. Returns the requests denied.
    """
    now = now or timezone.now()
    waiting = Run.objects.filter(
        status=RunStatus.AWAITING_APPROVAL,
        automation_firings__trigger__approval_timeout_seconds__isnull=False,
    ).values_list("pk", "automation_firings__trigger__approval_timeout_seconds", "automation_firings__pk")
    denied = 0
    for run_id, timeout, firing_id in list(waiting):
        asked = JournalEvent.objects.filter(
            run_id=run_id, type=EventType.APPROVAL_REQUESTED, created_at__lte=now - timedelta(seconds=timeout)
        )
        for request in asked:
            approval_id = str(request.payload.get("approval_id", ""))
            if not approval_id or _answered(run_id, approval_id):
                continue
            run = Run.objects.get(pk=run_id)
            option = reject_option(request.payload.get("options") or [])
            if option is not None:
                result = do_respond_approval(run, approval_id, option)
                what = f"approval {approval_id} denied ({option}) after {timeout} s unanswered"
            else:
                result = do_cancel(run)
                what = f"approval {approval_id} offered no reject option: turn cancelled after {timeout} s"
            if result.accepted:
                denied += 1
                note_on_firing(firing_id, what)
                log.info("run %s: %s", run_id, what)
    return denied


def _answered(run_id: int, approval_id: str) -> bool:
    # Resolved in the journal, or an answer already on its way to the runner.
    return (
        JournalEvent.objects.filter(
            run_id=run_id, type=EventType.APPROVAL_RESOLVED, payload__approval_id=approval_id
        ).exists()
        or Control.objects.filter(run_id=run_id, key=f"approval:{approval_id}").exists()
    )


def reject_option(options: list[Any]) -> str | None:
    """The option id that denies: `reject_once`, else `reject_always`; None if none is offered."""
    kinds = {o.get("kind"): o.get("option_id") for o in options if isinstance(o, dict)}
    return kinds.get("reject_once") or kinds.get("reject_always")


def note_on_firing(firing_id: int, note: str) -> None:
    firing = Firing.objects.get(pk=firing_id)
    reason = f"{firing.reason}; {note}" if firing.reason else note
    Firing.objects.filter(pk=firing_id).update(reason=reason[:2000])
