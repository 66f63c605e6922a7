"""Pending intents: what the user typed while a run was active (docs/intents.md)."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.utils import timezone

from projects.models import Session


class IntentKind(models.TextChoices):
    QUEUE = "queue"  # waits for the active run to end, then becomes a turn
    STEER = "steer"  # delivered to the active run as guidance; never a turn
    STOP_AND_SEND = "stop_and_send"  # cancel the active run, then become the next turn


class IntentState(models.TextChoices):
    WAITING = "waiting"  # editable, visible above the composer
    STOPPING = "stopping"  # stop-and-send: cancel requested, becomes the next turn
    DISPATCHED = "dispatched"  # became a Run (see `run`)
    DELIVERED = "delivered"  # steer delivered to `target_run`
    FAILED = "failed"  # could not be delivered; `reason` says why
    DELETED = "deleted"


OPEN_STATES = (IntentState.WAITING, IntentState.STOPPING)


class PendingIntentQuerySet(models.QuerySet["PendingIntent"]):
    def open(self) -> PendingIntentQuerySet:
        return self.filter(state__in=OPEN_STATES)

    def waiting(self) -> PendingIntentQuerySet:
        return self.filter(state=IntentState.WAITING)

    def visible_to(self, user: Any) -> PendingIntentQuerySet:
        # The user's own, staff too: staff act on others' objects only through the admin.
        return self.filter(session__project__owner=user)


class PendingIntent(models.Model):
    # No index of its own: (session, state, position) leads with it.
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="intents", db_index=False)
    client_id = models.CharField(max_length=100)
    kind = models.CharField(max_length=20, choices=IntentKind.choices, default=IntentKind.QUEUE)
    state = models.CharField(max_length=20, choices=IntentState.choices, default=IntentState.WAITING)
    text = models.TextField()
    attachments = models.JSONField(default=list, blank=True)
    position = models.PositiveIntegerField(default=0, help_text="Order among the session's waiting items.")
    version = models.PositiveIntegerField(default=1, help_text="Bumped on each change; edits must match it.")
    source = models.CharField(max_length=20, default="composer")
    source_meta = models.JSONField(default=dict, blank=True)
    target_run = models.ForeignKey(
        "runs.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="targeting_intents"
    )
    run = models.OneToOneField(
        "runs.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="from_intent"
    )
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    objects = PendingIntentQuerySet.as_manager()

    class Meta:
        ordering = ["position", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["session", "client_id"], name="intent_client_id_unique_per_session"
            )
        ]
        indexes = [models.Index(fields=["session", "state", "position"])]

    def __str__(self) -> str:
        return f"{self.kind} intent {self.pk} ({self.state})"
