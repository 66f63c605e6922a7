"""Claiming runs, renewing leases, reaping runs whose runner vanished."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from runs.models import JournalEvent, Run, RunStatus
from runs.runner import connections, leases
from runs.runner.claims import aclaim_run, previous_usage_total, run_context
from runs.runner.leases import Claim, ClaimedRun
from tests import factories
from tests.support import procs
from tests.support.pglocks import another_backend_waits_on_a_lock
from tests.support.runner import claim_next

pytestmark = pytest.mark.django_db


def test_claim_takes_the_oldest_queued_run_and_leases_it() -> None:
    older = factories.RunFactory(status="queued")
    factories.RunFactory(status="queued")
    assert claim_next("r1") == older.pk
    older.refresh_from_db()
    assert older.status == "running" and older.lease_owner == "r1" and older.lease_expires_at > timezone.now()


def test_a_claim_says_whether_another_queued_run_remains() -> None:
    first, second = factories.RunFactory(status="queued"), factories.RunFactory(status="queued")
    with transaction.atomic():
        assert leases.claim_in_transaction("r1") == Claim(ClaimedRun.of(first), more=True)
    with transaction.atomic():
        assert leases.claim_in_transaction("r1") == Claim(ClaimedRun.of(second), more=False)
    with transaction.atomic():
        assert leases.claim_in_transaction("r1") == Claim(None, more=False)


def test_a_claim_carries_what_starting_the_run_reads_of_its_session_and_project() -> None:
    run = factories.RunFactory(
        status="queued",
        prompt_text="hello",
        source="workflow",
        session__agent_session_id="agent-s1",
        session__model="m1",
        session__mode="plan",
    )
    with transaction.atomic():
        claimed = leases.claim_in_transaction("r1").run
    project = run.session.project
    assert claimed == ClaimedRun(
        run_id=run.pk,
        source="workflow",
        prompt_text="hello",
        session_id=run.session_id,
        agent_session_id="agent-s1",
        model="m1",
        mode="plan",
        project_id=project.pk,
        project_name=project.name,
        cwd=project.path,
        agent=project.agent,
        last_seq=0,
    )


def test_claim_returns_none_when_nothing_is_queued() -> None:
    factories.RunFactory(status="completed")
    assert claim_next("r1") is None


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


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_claim_in_flight_makes_another_runners_claim_wait_then_take_the_next_run_on_postgres() -> None:
    # Claims are serialised (docs/runner.md, "Fairness"): the second sees the first's, so it can
    # neither take the same run nor count a user's executing runs without it.
    runs = [factories.RunFactory(status="queued") for _ in range(3)]
    held, release = threading.Event(), threading.Event()
    got: dict[str, object] = {}

    def runner(name: str, hold: bool) -> None:
        try:
            with transaction.atomic():
                got[name] = leases.claim_in_transaction(name)
                if hold:
                    held.set()
                    release.wait(30)
        finally:
            connection.close()

    first = threading.Thread(target=runner, args=("r1", True))
    first.start()
    assert held.wait(30)
    second = threading.Thread(target=runner, args=("r2", False))
    second.start()
    try:
        procs.wait_for(another_backend_waits_on_a_lock, 30, what="the second claim to wait on the first")
        assert "r2" not in got
    finally:
        release.set()
        first.join(30)
        second.join(30)
    assert got["r1"] == Claim(ClaimedRun.of(runs[0]), more=True)
    claimed = got["r2"]
    assert isinstance(claimed, Claim) and claimed.run is not None
    assert claimed.run.run_id == runs[1].pk


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_runners_own_connection_claims_what_djangos_would_and_the_last_turns_usage_is_found() -> None:
    session = factories.SessionFactory(project__agent="hermes")  # reports session totals
    usage = {"session_total": {"total": 150}}
    factories.RunFactory(session=session, status="completed", finished_at=timezone.now(), usage=usage)
    queued = factories.RunFactory(session=session, status="queued", prompt_text="next")
    factories.RunFactory(status="queued")

    async def claim() -> Any:
        params = connections.connection_params()
        async with await psycopg.AsyncConnection.connect(**params, autocommit=True) as conn:
            return await aclaim_run("r1", conn)

    claimed = asyncio.run(claim())

    queued.refresh_from_db()
    assert (queued.status, queued.lease_owner) == ("running", "r1")
    assert claimed.more
    assert claimed.context == run_context(ClaimedRun.of(queued))
    assert claimed.context.cumulative_usage
    assert previous_usage_total(claimed.context) == {"total": 150}


def test_the_runs_a_doubted_claim_took_are_those_it_started_at_its_time_alone() -> None:
    at = timezone.now()
    taken = factories.RunFactory(status="running", lease_owner="r1", started_at=at, last_seq=0)
    # An execution that ended without a word written is not started again; nor is a run
    # already journaled, nor another runner's.
    factories.RunFactory(status="running", lease_owner="r1", started_at=at - timedelta(seconds=5), last_seq=0)
    factories.RunFactory(status="running", lease_owner="r1", started_at=at, last_seq=3)
    factories.RunFactory(status="running", lease_owner="r2", started_at=at, last_seq=0)

    assert [c.run_id for c in leases.unstarted_claims("r1", [at], running=[])] == [taken.pk]
    assert leases.unstarted_claims("r1", [at], running=[taken.pk]) == []


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_renewing_leases_holds_one_run_at_a_time_so_a_journal_batch_never_deadlocks_with_it() -> None:
    """bench/soak.py found it: one UPDATE renewing every lease locked run A, then waited for run B,
    which the journal writer's batch held while it waited for A: a deadlock."""
    from django.db import OperationalError

    from tests.support.procs import wait_for

    a, b = (
        factories.RunFactory(status="running", lease_owner="r1", lease_expires_at=timezone.now())
        for _ in range(2)
    )
    renewed: dict[str, Any] = {}

    def renew() -> None:
        try:
            renewed["held"] = leases.renew_leases("r1", [a.pk, b.pk])
        except BaseException as exc:  # shown by the assertion below
            renewed["error"] = exc
        finally:
            connection.close()

    with transaction.atomic():
        # The writer's batch: it holds run B (its seqs taken) and will take run A next.
        Run.objects.filter(pk=b.pk).update(last_seq=b.last_seq + 1)
        renewer = threading.Thread(target=renew)
        renewer.start()
        waiting = lambda: another_backend_waits_on_a_lock() or renewed  # noqa: E731
        wait_for(waiting, 10, what="the renewal to wait for run B")
        assert not renewed, f"the renewal did not wait for run B: {renewed}"
        try:
            Run.objects.select_for_update(nowait=True).get(pk=a.pk)
        except OperationalError as exc:
            raise AssertionError(f"the renewal holds run A while it waits for run B: {exc}") from exc
    renewer.join(10)
    assert renewed["held"] == {a.pk, b.pk}
    assert Run.objects.filter(pk__in=[a.pk, b.pk], lease_expires_at__gt=timezone.now()).count() == 2
