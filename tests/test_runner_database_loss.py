"""A runner whose database connections are cut (a PostgreSQL restart, a failover, a proxy's
idle timeout) connects again and goes on: the turn it was streaming completes with every
chunk once, and it takes the next turns. Nobody has to restart it by hand.

The streaming turn is the demo agent's `hold`: it streams until the test has done its cut and
releases it, so no step races the stream's end."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection

from runs.models import Run, RunStatus
from runs.runner import connections
from tests import factories
from tests.support.hold import release
from tests.support.pgproxy import UNENCRYPTED, PgProxy
from tests.support.procs import Proc, start_runner, wait_for
from tests.support.runs import (
    assert_journal_well_formed,
    run_of,
    state,
    submit,
    wait_status,
)

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

APP = "hermesweb-test-runner-cut"


def held_chunks(run: Run) -> int:
    return state(run)["text"].count("Held chunk ")


def held_text(chunks: int) -> str:
    """What a `hold` turn released after `chunks` chunks says, exactly."""
    return (
        "".join(f"Held chunk {n}. " for n in range(1, chunks + 1))
        + f"\n\nReleased after {chunks} held chunks."
    )


def stream_on_and_release(run: Run, session: Any) -> None:
    """Let the turn stream a few chunks more (its writes go through the new connections), then end it."""
    seen = held_chunks(run)
    wait_for(lambda: held_chunks(run) >= seen + 5, 30, what="the turn to stream on")
    release(session.project.path)


@pytest.fixture
def runner(runners: list[Proc], logs: Path) -> Proc:
    # libpq names every connection the runner opens, so the cut below reaches its alone.
    proc = start_runner(logs, "cut", HERMESWEB_DEMO_DELAY="0.005", PGAPPNAME=APP)
    runners.append(proc)
    return proc


@pytest.fixture
def session(db: None) -> Any:
    return factories.SessionFactory(project__agent="demo")


def cut_the_runners_connections() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s",
            [APP],
        )
        return cursor.fetchone()[0]


def test_a_runner_whose_connections_were_cut_while_idle_takes_the_next_turn(
    runner: Proc, session: Any
) -> None:
    first = run_of(submit(session, "fast one"))
    wait_status(first, RunStatus.COMPLETED, log=runner.log)

    assert cut_the_runners_connections() >= 2  # its Django connection, its claim's, its doorbell's

    second = run_of(submit(session, "show me a tool please"))
    wait_status(second, RunStatus.COMPLETED, timeout=30, log=runner.log)
    assert_journal_well_formed(second)
    assert runner.alive()


def test_a_turn_streaming_when_the_connections_are_cut_loses_and_repeats_nothing(
    runner: Proc, session: Any
) -> None:
    run = run_of(submit(session, "hold"))  # streaming until released, after the cut
    wait_for(lambda: "Held chunk 3." in state(run)["text"], 30, what="the turn to stream")
    assert cut_the_runners_connections() >= 2
    stream_on_and_release(run, session)

    wait_status(run, RunStatus.COMPLETED, timeout=60, log=runner.log)
    assert_journal_well_formed(run)
    # Every chunk the agent sent, once each and in order: none lost with the connections,
    # none written twice by a write whose answer the cut swallowed.
    assert state(run)["text"] == held_text(held_chunks(run))

    after = run_of(submit(session, "fast again"))
    wait_status(after, RunStatus.COMPLETED, timeout=30, log=runner.log)


def test_a_write_cut_off_midway_is_written_once_and_the_turn_completes(runner: Proc, session: Any) -> None:
    run = run_of(submit(session, "hold"))  # streaming until released, after the cut
    wait_for(lambda: "Held chunk 3." in state(run)["text"], 30, what="the turn to stream")

    # Hold the run's row so the runner's next journal write waits on it, then cut that
    # write's connection while it waits: the runner cannot know whether it committed, as
    # when a server dies under a statement, and reads the journal back to find out.
    with psycopg.connect(**connections.connection_params()) as holder:
        holder.execute(f"SELECT 1 FROM {Run._meta.db_table} WHERE id = %s FOR UPDATE", [run.pk])
        waiting = wait_for(lambda: _runner_backend_waiting_on_a_lock(holder), 30, what="a blocked write")
        holder.execute("SELECT pg_terminate_backend(%s)", [waiting])
        holder.rollback()
    stream_on_and_release(run, session)

    wait_status(run, RunStatus.COMPLETED, timeout=60, log=runner.log)
    assert_journal_well_formed(run)
    assert state(run)["text"] == held_text(held_chunks(run))
    assert "a journal write went unanswered" in runner.log()


def test_a_turn_streams_on_through_a_database_outage_and_loses_and_repeats_nothing(
    pg_proxy: PgProxy, runners: list[Proc], logs: Path, session: Any
) -> None:
    # Everything the runner does with the database goes through the proxy: its Django
    # connections, its loop's, its doorbell's.
    url = pg_proxy.database_url()
    runner = start_runner(logs, "outage", HERMESWEB_DEMO_DELAY="0.005", DATABASE_URL=url)
    runners.append(runner)
    run = run_of(submit(session, "hold"))  # streaming until released, after the cut
    wait_for(lambda: "Held chunk 3." in state(run)["text"], 30, what="the turn to stream")

    with pg_proxy.outage():
        wait_for(lambda: "group commit of 1 runs" in runner.log(), 30, what="a journal write to fail")
        written = len(state(run)["text"])
        # The outage lasts (a restart, a failover) while the agent streams on.
        time.sleep(2)
        assert len(state(run)["text"]) == written  # nothing reached the database meanwhile
    stream_on_and_release(run, session)

    wait_status(run, RunStatus.COMPLETED, timeout=60, log=runner.log)
    assert_journal_well_formed(run)
    assert state(run)["text"] == held_text(held_chunks(run))
    assert runner.alive()

    after = run_of(submit(session, "fast again"))
    wait_status(after, RunStatus.COMPLETED, timeout=30, log=runner.log)


def _runner_backend_waiting_on_a_lock(conn: psycopg.Connection[Any]) -> int | None:
    row = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
        [APP],
    ).fetchone()
    return row[0] if row else None


def test_a_claim_whose_answer_was_lost_is_started_by_its_runner(
    pg_proxy: PgProxy, runners: list[Proc], logs: Path, session: Any
) -> None:
    # Claims only when the doorbell rings, so few go by before the one that takes the run.
    url = pg_proxy.database_url(**UNENCRYPTED)
    runner = start_runner(logs, "claim-lost", DATABASE_URL=url, HERMESWEB_RUNNER_POLL_SECONDS="30")
    runners.append(runner)
    # The claim that takes the run commits; its answer never reaches the runner.
    pg_proxy.lose_next_answer(to=b"pg_advisory_xact_lock", with_rows=True)  # the claim (leases)
    run = run_of(submit(session, "fast hello"))

    wait_status(run, RunStatus.COMPLETED, timeout=30, log=runner.log)
    assert pg_proxy.answers_lost == 1
    assert "taken by a claim whose answer was lost" in runner.log()
    assert_journal_well_formed(run)


def test_a_sessions_update_is_tried_again_through_an_outage_and_given_up_after_the_deadline(
    settings: Any,
) -> None:
    from django.db import OperationalError

    calls: list[int] = []

    def store(value: int, failures: int) -> int:
        calls.append(value)
        if len(calls) <= failures:
            raise OperationalError("server closed the connection unexpectedly")
        return value

    assert asyncio.run(connections.retried(store, 7, failures=2)) == 7
    assert calls == [7, 7, 7]

    calls.clear()
    settings.HERMESWEB_DB_RETRY_SECONDS = 0.2
    with pytest.raises(OperationalError):
        asyncio.run(connections.retried(store, 8, failures=10**6))
    assert len(calls) > 1
