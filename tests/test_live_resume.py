"""Resuming a run's stream: after a socket drops, and after the web process is killed mid-run."""

from __future__ import annotations

from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed

from runs import services
from runs.models import Run
from tests import factories
from tests.support.hold import release
from tests.support.live import LiveStack, assert_contiguous, layer, live, session_cookie  # noqa: F401
from tests.support.procs import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def start_held_run(session: Any) -> Run:
    """The demo agent's `hold` script: a chunk every 0.05 s until the test releases it."""
    result = services.do_submit_message(session, client_id="hold-1", text="hold please")
    assert result.run is not None
    return result.run


def last_seq(run: Run) -> int:
    return Run.objects.values_list("last_seq", flat=True).get(pk=run.pk)


def test_a_resume_after_a_disconnect_gets_every_event_exactly_once_in_order(live: LiveStack) -> None:
    live.start_daphne()
    live.start_runner()
    session = factories.SessionFactory()
    cookie = session_cookie(session.project.owner)
    first = live.socket(session.pk, cookie)
    first.subscribe()
    first.session()
    run = start_held_run(session)  # new since the subscribe: followed from seq 1
    before = first.events_until(run.pk, lambda e: e["seq"] >= 10, timeout=90)
    assert_contiguous(before, 1)
    first.close()
    cursor = before[-1]["seq"]
    # The run goes on while nobody watches.
    wait_for(lambda: last_seq(run) >= cursor + 10, timeout=60, what="the run to go on")

    second = live.socket(session.pk, cookie)
    second.subscribe({run.pk: cursor})
    release(session.project.path)
    after = second.events_to_terminal(run.pk, timeout=90)
    assert_contiguous(after, cursor + 1, last_seq(run))
    assert after[-1]["type"] == "done" and after[-1]["payload"]["state"] == "completed"
    assert_contiguous(before + after, 1, last_seq(run))
    assert not [f for f in second.quiet(0.5) if f["type"] == "event"]


def test_a_killed_web_process_is_caught_up_after_restart_while_the_run_goes_on(live: LiveStack) -> None:
    live.start_daphne()
    live.start_runner()
    session = factories.SessionFactory()
    cookie = session_cookie(session.project.owner)
    run = start_held_run(session)
    first = live.socket(session.pk, cookie)
    first.subscribe()
    first.events_until(run.pk, lambda e: e["seq"] >= 10, timeout=90)
    assert live.daphne is not None
    live.daphne.kill9()
    with pytest.raises(ConnectionClosed):
        first.until(lambda f: False, timeout=30)
    received = [f["event"] for f in first.frames if f["type"] == "event"]
    cursor = received[-1]["seq"]
    wait_for(lambda: last_seq(run) >= cursor + 10, timeout=60, what="the run to go on without a web process")

    live.start_daphne()
    second = live.socket(session.pk, cookie)
    second.subscribe({run.pk: cursor})
    caught_up = second.events_until(run.pk, lambda e: e["seq"] >= cursor + 10, timeout=60)
    # Still executing after the catch-up: what follows is live, not replay.
    assert Run.objects.get(pk=run.pk).is_active
    release(session.project.path)
    after = caught_up + second.events_to_terminal(run.pk, timeout=90)
    assert_contiguous(after, cursor + 1, last_seq(run))
    assert_contiguous(received + after, 1, last_seq(run))
    assert after[-1]["payload"]["state"] == "completed"
