"""The scheduler in real runner processes (issue 42): any runner may fire, the database decides.

Two runners poll the same due schedules; each planned time still fires exactly once (the
unique (trigger, planned_at) and the trigger's row lock decide). A time that passed while no
runner ran is recorded skipped, or run once. Runs on SQLite here and on PostgreSQL in
bin/test's second pass; the race of two transactions over one time is PostgreSQL's below.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from automations import services
from automations.models import Firing, FiringOutcome, Trigger, TriggerKind
from runs.models import Run, Runner, RunStatus
from tests import factories
from tests.support import procs
from tests.support.runs import wait_status

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"HERMESWEB_DEMO_DELAY": "0.005"}


@pytest.fixture
def workflow(project: Any) -> Any:
    return factories.WorkflowFactory(project=project, prompt_template="fast nightly {what}")


def one_shot(api: Client, workflow: Any, at: datetime, **fields: Any) -> int:
    response = api.post(
        f"/api/workflows/{workflow.pk}/triggers",
        {"kind": "schedule", "at": at.isoformat(), "variables": {"what": "check"}, **fields},
        content_type="application/json",
    )
    assert response.status_code == 201, response.content
    return int(response.json()["id"])


def alive(*names: str) -> bool:
    return Runner.objects.filter(id__in=names, stopped_at__isnull=True).count() == len(names)


def test_one_shot_schedules_fire_once_each_with_two_runners(
    api: Client, workflow: Any, runners: list[Any], logs: Path
) -> None:
    runners += [procs.start_runner(logs, name, **FAST) for name in ("one", "two")]
    procs.wait_for(lambda: alive("one", "two"), 60, what="both runners to register")
    # Several triggers at one instant: both runners find them due in the same tick or so.
    at = timezone.now() + timedelta(seconds=2)
    ids = [one_shot(api, workflow, at) for _ in range(4)]

    firings = procs.wait_for(
        lambda: (rows := list(Firing.objects.filter(trigger_id__in=ids))) and len(rows) >= len(ids) and rows,
        60,
        what="every trigger to fire",
    )
    for firing in firings:
        assert firing.outcome == FiringOutcome.LAUNCHED, firing.reason
        wait_status(Run.objects.get(pk=firing.run_id), RunStatus.COMPLETED, timeout=60)
    # Both runners' loops have gone well past the instant (their heartbeats say they run on).
    later = at + timedelta(seconds=3)
    procs.wait_for(
        lambda: Runner.objects.filter(id__in=["one", "two"], heartbeat_at__gt=later).count() == 2,
        60,
        what="both runners to live past the planned time",
    )
    assert Firing.objects.filter(trigger_id__in=ids).count() == len(ids)
    assert Run.objects.count() == len(ids)
    assert {f.fired_by for f in firings} <= {"one", "two"}
    assert not Trigger.objects.filter(pk__in=ids, next_fire_at__isnull=False).exists()


def test_a_time_missed_while_no_runner_ran_is_skipped_or_run_once(
    api: Client, workflow: Any, runners: list[Any], logs: Path
) -> None:
    at = timezone.now() + timedelta(seconds=1)
    skipped = one_shot(api, workflow, at)
    run_once = one_shot(api, workflow, at, missed="run_once")
    disabled = one_shot(api, workflow, at, enabled=False)
    # No runner is running across the planned time; then one starts, the time 2 s past.
    procs.wait_for(lambda: timezone.now() > at + timedelta(seconds=2), 10, what="the planned time to pass")
    runners.append(procs.start_runner(logs, "back", HERMESWEB_AUTOMATION_MISSED_SECONDS="1", **FAST))

    missed = procs.wait_for(lambda: Firing.objects.filter(trigger_id=skipped).first(), 60, what="the skip")
    assert missed.outcome == FiringOutcome.SKIPPED_MISSED and missed.run_id is None
    late = procs.wait_for(lambda: Firing.objects.filter(trigger_id=run_once).first(), 60, what="the late run")
    assert late.outcome == FiringOutcome.LAUNCHED and late.reason.startswith("late:")
    wait_status(Run.objects.get(pk=late.run_id), RunStatus.COMPLETED, timeout=60)
    assert not Firing.objects.filter(trigger_id=disabled).exists()
    assert Run.objects.count() == 1


@pytest.mark.postgres
def test_two_transactions_racing_for_one_planned_time_launch_once(workflow: Any) -> None:
    # The first holds the trigger's row lock while it launches; the second waits on it, then
    # finds the time taken. Threads: each its own connection, as two runners would be.
    planned = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=1)
    trigger = Trigger.objects.create(
        workflow=workflow,
        kind=TriggerKind.SCHEDULE,
        cron="* * * * *",
        next_fire_at=planned,
        variables={"what": "race"},
    )
    start = threading.Barrier(2)
    results: list[Any] = []

    def fire() -> None:
        try:
            start.wait()
            results.append(services.do_fire_planned(trigger.pk, planned, now=planned + timedelta(seconds=1)))
        finally:
            connection.close()

    threads = [threading.Thread(target=fire) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    decided = [r for r in results if r is not None]
    assert len(results) == 2 and len(decided) == 1
    assert Firing.objects.filter(trigger=trigger).count() == 1 and Run.objects.count() == 1
