"""Triggers on a workflow and the firings they planned (design note: docs/automations.md).

A Trigger is a schedule (cron in a time zone, or one instant) or a webhook (a secret URL, kept
only as its SHA-256). A Firing is one planned time of one trigger; the unique (trigger,
planned_at) is what decides, across every process, that a time fires exactly once.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

from django.db import models
from django.db.models import Q
from django.utils.timezone import now

from intents.models import PendingIntent
from projects.models import Session, Workflow
from runs.models import Run

# A webhook's secret carries the API tokens' prefix, so the log redaction masks it in URLs too.
SECRET_PREFIX = "hw_hook_"


def hash_secret(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


class TriggerKind(models.TextChoices):
    SCHEDULE = "schedule"
    WEBHOOK = "webhook"


class MissedPolicy(models.TextChoices):
    SKIP = "skip"  # a time no scheduler saw in time is recorded skipped_missed
    RUN_ONCE = "run_once"  # it fires once when a scheduler is back


class OverlapPolicy(models.TextChoices):
    SKIP = "skip"  # while a run of this trigger is active, a new time is recorded skipped_overlap
    QUEUE = "queue"  # it queues behind that run, in its session, as a pending intent


class TriggerQuerySet(models.QuerySet["Trigger"]):
    def visible_to(self, user: Any) -> TriggerQuerySet:
        return self.filter(workflow__project__owner=user)  # staff too, as ProjectQuerySet.visible_to

    def enabled(self) -> TriggerQuerySet:
        return self.filter(enabled=True)

    def due(self, now: datetime) -> TriggerQuerySet:
        """Enabled schedules whose next planned time has come (the index on next_fire_at serves it)."""
        return self.enabled().filter(next_fire_at__lte=now)

    def for_secret(self, raw: str) -> TriggerQuerySet:
        return self.filter(kind=TriggerKind.WEBHOOK, secret_digest=hash_secret(raw))


class Trigger(models.Model):
    workflow = models.ForeignKey(Workflow, on_delete=models.CASCADE, related_name="triggers")
    kind = models.CharField(max_length=20, choices=TriggerKind.choices)
    enabled = models.BooleanField(default=True)
    cron = models.CharField(max_length=200, blank=True, help_text="Five fields; empty for `at` and webhooks.")
    timezone = models.CharField(max_length=64, blank=True, help_text="IANA name the cron is read in.")
    at = models.DateTimeField(null=True, blank=True, help_text="A one-shot schedule's instant.")
    missed = models.CharField(max_length=20, choices=MissedPolicy.choices, default=MissedPolicy.SKIP)
    overlap = models.CharField(max_length=20, choices=OverlapPolicy.choices, default=OverlapPolicy.SKIP)
    variables = models.JSONField(default=dict, blank=True, help_text="Template variables every firing gets.")
    session = models.ForeignKey(
        Session,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Fire into this session (a queued turn) instead of a new one each time.",
    )
    # Unattended never means more power: a permission request of a run this trigger launched
    # that nobody answers within this is denied (a reject option, or the turn cancelled).
    approval_timeout_seconds = models.PositiveIntegerField(
        null=True, blank=True, help_text="Deny a waiting approval after this long; empty: wait."
    )
    # Only the hash: the URL is shown once, when made or rotated.
    secret_digest = models.CharField(max_length=64, null=True, blank=True, unique=True)
    # The scheduler's cursor: the next planned time, null when nothing is planned (a webhook,
    # a one-shot that fired). Advanced in the transaction that records the firing.
    next_fire_at = models.DateTimeField(null=True, blank=True, db_index=True)
    created_at = models.DateTimeField(default=now)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TriggerQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(kind="webhook") | ~Q(cron="") | Q(at__isnull=False),
                name="schedule_has_cron_or_at",
            )
        ]

    def __str__(self) -> str:
        what = self.cron or (self.at.isoformat() if self.at else "") if self.kind == "schedule" else "webhook"
        return f"{self.workflow} · {what}"


class FiringOutcome(models.TextChoices):
    PENDING = "pending"  # inside the transaction that decides it; never committed as such
    LAUNCHED = "launched"
    SKIPPED_OVERLAP = "skipped_overlap"
    SKIPPED_MISSED = "skipped_missed"
    FAILED = "failed"


# The state machine: a firing is decided once, from pending, in the transaction that made it.
TRANSITIONS: dict[str, frozenset[str]] = {
    FiringOutcome.PENDING: frozenset(
        {
            FiringOutcome.LAUNCHED,
            FiringOutcome.SKIPPED_OVERLAP,
            FiringOutcome.SKIPPED_MISSED,
            FiringOutcome.FAILED,
        }
    ),
}


class IllegalTransition(RuntimeError):
    """A firing asked to leave a state it cannot (a bug, never the caller's input)."""


class FiringQuerySet(models.QuerySet["Firing"]):
    def visible_to(self, user: Any) -> FiringQuerySet:
        return self.filter(trigger__workflow__project__owner=user)

    def of_workflow(self, workflow_id: int) -> FiringQuerySet:
        return self.filter(trigger__workflow_id=workflow_id)

    def recent_for(self, trigger_id: int, since: datetime) -> FiringQuerySet:
        return self.filter(trigger_id=trigger_id, planned_at__gt=since)


class Firing(models.Model):
    trigger = models.ForeignKey(Trigger, on_delete=models.CASCADE, related_name="firings")
    planned_at = models.DateTimeField()
    fired_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=20, choices=FiringOutcome.choices, default=FiringOutcome.PENDING)
    reason = models.TextField(blank=True)
    session = models.ForeignKey(Session, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    run = models.ForeignKey(
        Run, null=True, blank=True, on_delete=models.SET_NULL, related_name="automation_firings"
    )
    intent = models.ForeignKey(
        PendingIntent, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    fired_by = models.CharField(
        max_length=200, blank=True, help_text="The runner or web process that decided."
    )

    objects = FiringQuerySet.as_manager()

    class Meta:
        ordering = ["-planned_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["trigger", "planned_at"], name="one_firing_per_planned_time")
        ]

    def __str__(self) -> str:
        return f"{self.trigger_id} @ {self.planned_at.isoformat()}: {self.outcome}"

    def settle(self, outcome: str, reason: str = "", **links: Any) -> None:
        """Move from pending to `outcome` (TRANSITIONS) and save, with the session/run/intent made."""
        if outcome not in TRANSITIONS.get(self.outcome, frozenset()):
            raise IllegalTransition(f"firing {self.pk}: {self.outcome} → {outcome}")
        self.outcome = outcome
        self.reason = reason[:2000]
        self.fired_at = now()
        for name, value in links.items():
            setattr(self, name, value)
        self.save()
