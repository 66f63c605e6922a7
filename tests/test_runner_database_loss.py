"""A runner whose database connections are cut (a PostgreSQL restart, a failover, a proxy's
idle timeout) connects again and goes on taking turns: nobody has to restart it by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection

from runs import connections
from runs.demo_agent.scripts import SLOW_CHUNKS
from runs.models import Run, RunStatus
from tests import factories
from tests.support.procs import Proc, start_runner, wait_for
from tests.support.runs import (
    assert_journal_well_formed,
    events,
    run_of,
    state,
    submit,
    wait_status,
)

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

APP = "hermesweb-test-runner-cut"


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
    run = run_of(submit(session, "slow"))
    wait_for(lambda: "Slow chunk 3." in state(run)["text"], 30, what="the turn to stream")
    assert cut_the_runners_connections() >= 2

    final = wait_status(run, RunStatus.COMPLETED, RunStatus.FAILED, timeout=60, log=runner.log)
    assert_journal_well_formed(run)
    if final.status == RunStatus.COMPLETED:
        # Every chunk the agent sent, once each and in order: none lost with the connection.
        expected = "".join(f"Slow chunk {n}. " for n in range(1, SLOW_CHUNKS + 1))
        assert state(run)["text"] == expected + "\n\nFinished the slow run."
    else:
        # Only a cut in the middle of a write does this: whether that write committed is
        # unknown, so the turn is stopped and says so, rather than write it twice or go on
        # with a hole in it.
        errors = [e.payload for e in events(run) if e.type == "error"]
        assert [e["code"] for e in errors] == ["journal_write_lost"]

    after = run_of(submit(session, "fast again"))
    wait_status(after, RunStatus.COMPLETED, timeout=30, log=runner.log)


def test_a_write_cut_off_midway_stops_the_turn_and_says_so(runner: Proc, session: Any) -> None:
    run = run_of(submit(session, "slow"))
    wait_for(lambda: "Slow chunk 3." in state(run)["text"], 30, what="the turn to stream")

    # Hold the run's row so the runner's next journal write waits on it, then cut that
    # write's connection while it waits: whether such a write committed is unknown to the
    # runner, as when a server dies under a statement.
    with psycopg.connect(**connections.connection_params()) as holder:
        holder.execute(f"SELECT 1 FROM {Run._meta.db_table} WHERE id = %s FOR UPDATE", [run.pk])
        waiting = wait_for(lambda: _runner_backend_waiting_on_a_lock(holder), 30, what="a blocked write")
        holder.execute("SELECT pg_terminate_backend(%s)", [waiting])
        holder.rollback()

    wait_status(run, RunStatus.FAILED, timeout=60, log=runner.log)
    assert_journal_well_formed(run)
    errors = [e.payload for e in events(run) if e.type == "error"]
    assert [e["code"] for e in errors] == ["journal_write_lost"]

    after = run_of(submit(session, "fast again"))
    wait_status(after, RunStatus.COMPLETED, timeout=30, log=runner.log)


def _runner_backend_waiting_on_a_lock(conn: psycopg.Connection[Any]) -> int | None:
    row = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
        [APP],
    ).fetchone()
    return row[0] if row else None
