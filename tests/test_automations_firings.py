"""Firings (issue 42): each planned time decided once — launched, skipped or failed — and listed.

The scheduler's decisions, called in-process at chosen times (services.fire_due); the real
runners deciding among themselves are tests/test_automations_runners.py. docs/automations.md.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext

from automations import services
from automations.models import Firing, FiringOutcome, Trigger, TriggerKind
from intents.models import PendingIntent
from projects.models import ProjectStatus
from runs.models import Run, RunSource, RunStatus
from tests import factories

pytestmark = pytest.mark.django_db

MINUTE = "* * * * *"


@pytest.fixture
def workflow(project: Any) -> Any:
    return factories.WorkflowFactory(
        project=project, prompt_template="Nightly check of {target}.", agent_model="some-model"
    )


def schedule(workflow: Any, planned: datetime, **fields: Any) -> Trigger:
    """A schedule whose next planned time is `planned` (as if planned earlier)."""
    fields.setdefault("cron", MINUTE)
    fields.setdefault("variables", {"target": "the lock file"})
    return Trigger.objects.create(
        workflow=workflow, kind=TriggerKind.SCHEDULE, next_fire_at=planned, **fields
    )


def minute(offset: int = 0) -> datetime:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    return now + timedelta(minutes=offset)


def test_a_one_shot_fires_once_into_a_new_session_with_the_workflows_settings(workflow: Any) -> None:
    at = minute(-1)
    trigger = schedule(workflow, at, cron="", at=at)

    fired = services.fire_due(at + timedelta(seconds=1), fired_by="test")
    assert [f.outcome for f in fired] == [FiringOutcome.LAUNCHED]
    firing = fired[0]
    run = Run.objects.get(pk=firing.run_id)
    assert run.prompt_text == "Nightly check of the lock file."
    assert run.source == RunSource.WORKFLOW and run.status == RunStatus.QUEUED
    assert run.session_id == firing.session_id and run.session.project_id == workflow.project_id
    assert run.session.model == "some-model" and run.session.title == workflow.name
    assert firing.planned_at == at and firing.fired_at is not None and firing.fired_by == "test"

    assert services.fire_due(at + timedelta(seconds=2)) == []
    trigger.refresh_from_db()
    assert trigger.next_fire_at is None
    assert Firing.objects.count() == 1 and Run.objects.count() == 1


def test_a_planned_time_is_decided_once_and_the_unique_constraint_refuses_a_second(workflow: Any) -> None:
    planned = minute(-1)
    trigger = schedule(workflow, planned)
    now = planned + timedelta(seconds=1)
    assert services.do_fire_planned(trigger.pk, planned, now=now) is not None
    assert services.do_fire_planned(trigger.pk, planned, now=now) is None  # the cursor moved on

    # Even with the cursor put back, the row decides: nothing fires twice.
    Trigger.objects.filter(pk=trigger.pk).update(next_fire_at=planned)
    assert services.do_fire_planned(trigger.pk, planned, now=now) is None
    with pytest.raises(IntegrityError), transaction.atomic():
        Firing.objects.create(trigger=trigger, planned_at=planned)
    assert Firing.objects.filter(trigger=trigger).count() == 1 and Run.objects.count() == 1


def test_the_cursor_moves_to_the_next_cron_time(workflow: Any) -> None:
    planned = minute(-1)
    trigger = schedule(workflow, planned)
    services.fire_due(planned + timedelta(seconds=1))
    trigger.refresh_from_db()
    assert trigger.next_fire_at == planned + timedelta(minutes=1)


def test_overlap_is_skipped_while_the_triggers_run_is_active(workflow: Any) -> None:
    first = minute(-2)
    trigger = schedule(workflow, first)
    launched = services.fire_due(first + timedelta(seconds=1))[0]
    assert launched.outcome == FiringOutcome.LAUNCHED

    second = services.fire_due(first + timedelta(minutes=1, seconds=1))[0]
    assert second.outcome == FiringOutcome.SKIPPED_OVERLAP
    assert str(launched.run_id) in second.reason and second.run_id is None
    assert Run.objects.count() == 1

    Run.objects.filter(pk=launched.run_id).update(status=RunStatus.COMPLETED)
    trigger.refresh_from_db()
    third = services.fire_due(trigger.next_fire_at + timedelta(seconds=1))[0]
    assert third.outcome == FiringOutcome.LAUNCHED and third.session_id != launched.session_id


def test_overlap_queue_waits_behind_the_active_run_in_its_session(workflow: Any) -> None:
    first = minute(-2)
    schedule(workflow, first, overlap="queue")
    launched = services.fire_due(first + timedelta(seconds=1))[0]
    queued = services.fire_due(first + timedelta(minutes=1, seconds=1))[0]
    assert queued.outcome == FiringOutcome.LAUNCHED
    assert queued.run_id is None and queued.session_id == launched.session_id
    intent = PendingIntent.objects.get(pk=queued.intent_id)
    assert intent.session_id == launched.session_id and intent.text == "Nightly check of the lock file."


def test_a_time_missed_while_no_scheduler_ran_is_recorded_skipped(workflow: Any, settings: Any) -> None:
    settings.HERMESWEB_AUTOMATION_MISSED_SECONDS = 60
    planned = minute(-10)
    trigger = schedule(workflow, planned)
    now = planned + timedelta(minutes=10, seconds=5)

    fired = services.fire_due(now)
    assert [f.outcome for f in fired] == [FiringOutcome.SKIPPED_MISSED]
    assert "no scheduler was running" in fired[0].reason and fired[0].run_id is None
    assert not Run.objects.exists()
    # The cursor moved past what was missed; a time within the grace still fires on time.
    trigger.refresh_from_db()
    assert now - timedelta(seconds=60) < trigger.next_fire_at <= now
    assert [f.outcome for f in services.fire_due(now)] == [FiringOutcome.LAUNCHED]


def test_a_missed_one_shot_runs_once_with_run_once(workflow: Any, settings: Any) -> None:
    settings.HERMESWEB_AUTOMATION_MISSED_SECONDS = 60
    at = minute(-30)
    schedule(workflow, at, cron="", at=at, missed="run_once")
    fired = services.fire_due(at + timedelta(minutes=30))
    assert [f.outcome for f in fired] == [FiringOutcome.LAUNCHED]
    assert fired[0].reason.startswith("late:") and fired[0].run_id is not None
    assert services.fire_due(at + timedelta(minutes=31)) == []


def test_a_disabled_trigger_does_not_fire_and_re_enabling_plans_from_now(workflow: Any) -> None:
    planned = minute(-1)
    trigger = schedule(workflow, planned)
    services.do_update_trigger(trigger, enabled=False)
    assert services.fire_due(planned + timedelta(minutes=5)) == []
    trigger = services.do_update_trigger(trigger, enabled=True)
    assert trigger.next_fire_at > datetime.now(UTC)
    assert not Firing.objects.exists()


def test_a_firing_that_cannot_launch_is_recorded_failed_with_the_reason(workflow: Any) -> None:
    planned = minute(-1)
    trigger = schedule(workflow, planned, variables={})
    failed = services.fire_due(planned + timedelta(seconds=1))[0]
    assert failed.outcome == FiringOutcome.FAILED
    assert failed.reason.startswith("missing_variables:") and "target" in failed.reason

    Trigger.objects.filter(pk=trigger.pk).update(variables={"target": "x"})
    workflow.project.status = ProjectStatus.ARCHIVED
    workflow.project.save()
    archived = services.fire_due(planned + timedelta(minutes=1, seconds=1))[0]
    assert archived.outcome == FiringOutcome.FAILED and archived.reason.startswith("project_archived:")
    assert not Run.objects.exists()
    assert Firing.objects.count() == 2


def test_a_fixed_session_takes_the_firings(workflow: Any, project: Any) -> None:
    session = factories.SessionFactory(project=project)
    planned = minute(-1)
    schedule(workflow, planned, session=session)
    firing = services.fire_due(planned + timedelta(seconds=1))[0]
    assert firing.outcome == FiringOutcome.LAUNCHED and firing.session_id == session.pk
    assert Run.objects.get(pk=firing.run_id).session_id == session.pk


def test_the_history_lists_each_firing_with_its_outcome(api: Client, workflow: Any) -> None:
    first = minute(-2)
    trigger = schedule(workflow, first)
    services.fire_due(first + timedelta(seconds=1))
    services.fire_due(first + timedelta(minutes=1, seconds=1))

    listed = api.get(f"/api/workflows/{workflow.pk}/firings").json()
    assert [f["outcome"] for f in listed] == ["skipped_overlap", "launched"]
    assert listed[1]["run_id"] is not None and listed[1]["session_id"] is not None
    assert all(f["trigger_id"] == trigger.pk for f in listed)
    only = api.get(f"/api/workflows/{workflow.pk}/firings?trigger_id={trigger.pk}&limit=1").json()
    assert len(only) == 1


def test_a_tick_with_a_thousand_idle_triggers_is_two_queries(workflow: Any) -> None:
    # The scheduler's cost when nothing is due: the due read and the waiting-approvals read,
    # whatever the number of triggers (each an indexed lookup).
    later = minute(60)
    Trigger.objects.bulk_create(
        Trigger(workflow=workflow, kind=TriggerKind.SCHEDULE, cron=MINUTE, next_fire_at=later)
        for _ in range(1000)
    )
    with CaptureQueriesContext(connection) as queries:
        assert services.tick(datetime.now(UTC)) == []
    assert len(queries) == 2, [q["sql"] for q in queries]


def test_patch_sets_and_clears_the_approval_timeout(api: Client, workflow: Any) -> None:
    trigger = schedule(workflow, minute(5))
    url = f"/api/triggers/{trigger.pk}"
    body = api.patch(url, {"approval_timeout_seconds": 600}, content_type="application/json").json()
    assert body["approval_timeout_seconds"] == 600
    assert (
        api.patch(url, {"enabled": True}, content_type="application/json").json()["approval_timeout_seconds"]
        == 600
    )
    cleared = api.patch(url, {"approval_timeout_seconds": None}, content_type="application/json").json()
    assert cleared["approval_timeout_seconds"] is None
