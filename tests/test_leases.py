"""Claiming runs, renewing leases, reaping runs whose runner vanished."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from runs import leases
from runs.models import JournalEvent, Run, RunStatus
from tests import factories

pytestmark = pytest.mark.django_db


def test_claim_takes_the_oldest_queued_run_and_leases_it() -> None:
    older = factories.RunFactory(status="queued")
    factories.RunFactory(status="queued")
    assert leases.claim_next("r1") == older.pk
    older.refresh_from_db()
    assert older.status == "running" and older.lease_owner == "r1" and older.lease_expires_at > timezone.now()


def test_a_claim_says_whether_another_queued_run_remains() -> None:
    first, second = factories.RunFactory(status="queued"), factories.RunFactory(status="queued")
    with transaction.atomic():
        assert leases.claim_in_transaction("r1") == (first, True)
    with transaction.atomic():
        assert leases.claim_in_transaction("r1") == (second, False)
    with transaction.atomic():
        assert leases.claim_in_transaction("r1") == (None, False)


def test_claim_returns_none_when_nothing_is_queued() -> None:
    factories.RunFactory(status="completed")
    assert leases.claim_next("r1") is None


def test_renew_reports_runs_that_were_taken_away() -> None:
    mine = factories.RunFactory(status="running", lease_owner="r1", lease_expires_at=timezone.now())
    reaped = factories.RunFactory(status="interrupted", lease_owner="")
    assert leases.renew_leases("r1", [mine.pk, reaped.pk]) == {mine.pk}


def test_an_expired_lease_is_interrupted_with_a_terminal_event_and_never_requeued() -> None:
    runner = factories.RunnerFactory(
        id="gone", host="elsewhere", heartbeat_at=timezone.now() - timedelta(minutes=5)
    )
    run = factories.RunFactory(
        status="running", lease_owner=runner.id, lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert leases.reap_stale("reaper") == [run.pk]
    run.refresh_from_db()
    assert run.status == RunStatus.INTERRUPTED
    done = JournalEvent.objects.get(run=run, terminal=True)
    assert done.payload["state"] == "interrupted" and "gone" in done.payload["reason"]
    assert JournalEvent.objects.filter(run=run, type="error").exists()
    assert leases.reap_stale("reaper") == []  # exactly one terminal event
    assert Run.objects.filter(status="queued").count() == 0


def test_a_live_lease_is_left_alone() -> None:
    runner = factories.RunnerFactory(id="alive", host="elsewhere")
    factories.RunFactory(
        status="running", lease_owner=runner.id, lease_expires_at=timezone.now() + timedelta(seconds=30)
    )
    assert leases.reap_stale("reaper") == []


def test_a_dead_runner_on_this_host_is_reaped_without_waiting_for_its_lease() -> None:
    import socket

    runner = factories.RunnerFactory(id="dead-here", host=socket.gethostname(), pid=2**22 + 12345)
    run = factories.RunFactory(
        status="running", lease_owner=runner.id, lease_expires_at=timezone.now() + timedelta(minutes=5)
    )
    assert leases.reap_stale("reaper") == [run.pk]


def test_queued_runs_survive_the_reaper() -> None:
    run = factories.RunFactory(status="queued")
    leases.reap_stale("reaper")
    run.refresh_from_db()
    assert run.status == "queued"


def test_a_reaped_run_answers_its_pending_controls_as_expired() -> None:
    from runs.models import Control

    run = factories.RunFactory(status="cancelling", lease_owner="ghost", lease_expires_at=timezone.now())
    control = factories.ControlFactory(run=run, kind="cancel", key="cancel")
    assert leases.reap_stale("reaper") == [run.pk]
    control = Control.objects.get(pk=control.pk)
    assert (control.state, control.result) == ("rejected", "expired")
