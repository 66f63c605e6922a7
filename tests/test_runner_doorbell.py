"""On PostgreSQL runners wake on the database's NOTIFY, rung by the transaction that wrote the work.

The runners here poll once a minute and have no Redis: only the doorbell can make them
prompt, so every wait below is far shorter than their poll.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import transaction

from runs import notify
from runs.controls import do_cancel, do_respond_approval
from runs.models import Run, RunStatus
from runs.runner import connections
from tests import factories
from tests.support.procs import Proc, start_runner
from tests.support.runs import run_of, submit, wait_event, wait_status

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

PROMPT = 15.0  # seconds: a quarter of the runner's poll


@pytest.fixture
def runner(runners: list[Proc], logs: Path) -> Proc:
    proc = start_runner(
        logs, "bell", HERMESWEB_DEMO_DELAY="0.005", HERMESWEB_RUNNER_POLL_SECONDS="60", REDIS_URL=""
    )
    runners.append(proc)
    return proc


@pytest.fixture
def session(db: None) -> Any:
    return factories.SessionFactory(project__agent="demo")


@pytest.fixture
def listener() -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(**connections.connection_params(), autocommit=True) as conn:
        conn.execute(f"LISTEN {notify.RUNNERS_CHANNEL}")
        yield conn


def next_ring(conn: psycopg.Connection[Any]) -> str:
    rings = [n.payload for n in conn.notifies(timeout=5, stop_after=1)]
    assert rings, "no notification within 5 s"
    return rings[0]


def test_a_new_turn_rings_the_runners_once_with_its_run(session: Any, listener: Any) -> None:
    run = run_of(submit(session, "fast one"))
    assert next_ring(listener) == f"run.queued:{run.pk}"


def test_work_written_in_a_transaction_that_rolls_back_rings_nothing(session: Any, listener: Any) -> None:
    with pytest.raises(RuntimeError), transaction.atomic():
        submit(session, "never sent")
        raise RuntimeError("roll back")
    assert not Run.objects.exists()
    # Notifications arrive in commit order: the first one is the committed turn's.
    run = run_of(submit(session, "fast one"))
    assert next_ring(listener) == f"run.queued:{run.pk}"


def test_a_runner_that_polls_once_a_minute_takes_each_new_turn_at_once(runner: Proc, session: Any) -> None:
    for text in ("fast one", "fast two", "fast three"):
        run = run_of(submit(session, text))
        wait_status(run, RunStatus.COMPLETED, timeout=PROMPT, log=runner.log)


def test_an_answer_and_a_cancel_reach_a_runner_that_polls_once_a_minute(runner: Proc, session: Any) -> None:
    run = run_of(submit(session, "approve"))
    wait_status(run, RunStatus.AWAITING_APPROVAL, timeout=PROMPT, log=runner.log)
    request = wait_event(run, "approval.requested")
    assert do_respond_approval(run, request.payload["approval_id"], "allow_once").status == "accepted"
    wait_status(run, RunStatus.COMPLETED, timeout=PROMPT, log=runner.log)

    held = run_of(submit(session, "hold"))  # open until the cancel, however slow the poll
    wait_event(held, "token.delta", timeout=PROMPT)
    assert do_cancel(held).status == "accepted"
    wait_status(held, RunStatus.CANCELLED, timeout=PROMPT, log=runner.log)
