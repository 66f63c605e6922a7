"""API shapes for triggers, firings and webhooks."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from ninja import Field, Schema
from pydantic import Strict, StringConstraints

Cron = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
TimezoneName = Annotated[str, StringConstraints(strip_whitespace=True, max_length=64)]
VariableName = Annotated[str, StringConstraints(max_length=100)]
VariableValue = Annotated[str, StringConstraints(max_length=100_000)]
MissedName = Literal["skip", "run_once"]
OverlapName = Literal["skip", "queue"]


class TriggerIn(Schema):
    kind: Literal["schedule", "webhook"]
    cron: Cron | None = Field(None, description='Five cron fields, e.g. "0 7 * * 1-5" (schedules).')
    timezone: TimezoneName = Field("", description="IANA zone the cron is read in (default UTC).")
    at: datetime | None = Field(None, description="One instant with its offset (a one-shot schedule).")
    missed: MissedName = Field("skip", description="A time no scheduler saw: skip it, or run it once.")
    overlap: OverlapName = Field(
        "skip", description="While this trigger's last run is active: skip, or queue."
    )
    variables: dict[VariableName, VariableValue] = Field(
        default_factory=dict,
        description="Template variables every firing gets (a webhook's body adds its own).",
    )
    session_id: Annotated[int, Strict()] | None = Field(
        None, description="Fire into this session of the workflow's project instead of a new one each time."
    )
    enabled: bool = True
    approval_timeout_seconds: Annotated[int, Strict()] | None = Field(
        None,
        ge=1,
        le=7 * 24 * 3600,
        description="Deny a permission request of a fired run nobody answered within this (never grant).",
    )


class TriggerPatch(Schema):
    enabled: bool | None = None
    cron: Cron | None = None
    timezone: TimezoneName | None = None
    at: datetime | None = None
    missed: MissedName | None = None
    overlap: OverlapName | None = None
    variables: dict[VariableName, VariableValue] | None = None
    approval_timeout_seconds: Annotated[int, Strict()] | None = Field(None, ge=1, le=7 * 24 * 3600)


class TriggerOut(Schema):
    id: int
    workflow_id: int
    kind: str
    enabled: bool
    cron: str
    timezone: str
    at: datetime | None
    missed: str
    overlap: str
    variables: dict[str, str]
    session_id: int | None
    approval_timeout_seconds: int | None
    next_fire_at: datetime | None = Field(description="The next planned time (UTC); null when none.")
    url: str | None = Field(
        None, description="A webhook's URL, with its secret: in the answer that made it only, never again."
    )
    created_at: datetime
    updated_at: datetime


class SecretOut(Schema):
    url: str = Field(description="The webhook's new URL; the old one stops working now.")


class FiringOut(Schema):
    id: int
    trigger_id: int
    planned_at: datetime
    fired_at: datetime | None
    outcome: str = Field(description="launched, skipped_overlap, skipped_missed or failed.")
    reason: str
    session_id: int | None
    run_id: int | None
    intent_id: int | None


class FiringFilter(Schema):
    trigger_id: int | None = Field(None, description="Only this trigger's firings.")
    limit: int = Field(100, ge=1, le=500)


class HookOut(Schema):
    firing_id: int
    outcome: str
    session_id: int | None
    run_id: int | None
    intent_id: int | None = None


def trigger_out(trigger: Any, url: str | None = None) -> TriggerOut:
    out = TriggerOut.model_validate(trigger)
    out.url = url
    return out
