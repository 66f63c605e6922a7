"""Stop-and-send: cancel the active run and make a waiting item the next turn, exactly once.

Against a real runner and the bundled demo agent (`hold` streams until the test
releases or cancels it, and honours cancel at once). "Mid-cancel" is made
deterministic by pausing the runner (SIGSTOP) so the cancel request is durable but not yet applied; a
process boundary is a `kill -9` of that paused runner and a new one.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from intents.models import IntentKind, IntentState, PendingIntent
from projects.models import Session
from runs.controls import do_stop_and_send
from runs.models import Control, ControlKind, RunSource, RunStatus
from tests.support.intents import (
    FAST_DEMO,
    fresh,
    open_ids,
    pause,
    queue,
    resume,
    run_from,
    runner,  # noqa: F401
    runs_of,
    send,
    settled,
    spawn_runner,
    start_turn,
    turn_of,
    view,
)
from tests.support.live import LiveStack, assert_contiguous, layer, live, session_cookie  # noqa: F401
from tests.support.procs import Proc
from tests.support.runs import assert_journal_well_formed, events, state, types, wait_status

pytestmark = pytest.mark.django_db(transaction=True)


def done_state(run: Any) -> str:
    return events(run)[-1].payload["state"]


# ---------------------------------------------------------------- RFC: Testing Expectations


def test_stop_on_a_waiting_item_cancels_the_run_and_sends_the_item(
    runner: Proc, api: Client, session: Session
) -> None:
    busy = start_turn(session, "hold", started="token.delta")
    item = queue(session, "fast do this instead")
    later = queue(session, "fast and this after")

    answer = api.post(f"/api/intents/{item.pk}/stop-and-send")

    assert answer.status_code == 200 and answer.json()["status"] == "accepted"
    assert answer.json()["intent"]["kind"] == IntentKind.STOP_AND_SEND
    wait_status(busy, RunStatus.CANCELLED, log=runner.log)
    nxt = run_from(item)
    assert (nxt.source, nxt.prompt_text) == (RunSource.STOP_AND_SEND, "fast do this instead")
    wait_status(nxt, RunStatus.COMPLETED, log=runner.log)
    settled(session)
    assert [(r.prompt_text, r.source) for r in runs_of(session)] == [
        ("hold", RunSource.COMPOSER),
        ("fast do this instead", RunSource.STOP_AND_SEND),
        ("fast and this after", RunSource.QUEUE),
    ]
    assert "Held chunk" in state(busy)["text"]  # what the cancelled turn said stays
    assert fresh(later).state == IntentState.DISPATCHED
    for run in runs_of(session):
        assert_journal_well_formed(run)


def test_a_stop_and_send_replacement_survives_cancel_and_reconnect_timing(
    live: LiveStack, user: Any, session: Session
) -> None:
    live.start_daphne()
    proc = live.start_runner(HERMESWEB_DEMO_DELAY=FAST_DEMO)
    busy = start_turn(session, "hold", started="token.delta")
    item = queue(session, "fast take over now")
    cookie = session_cookie(user)
    first = live.socket(session.pk, cookie)
    first.subscribe()
    first.until(lambda f: f["type"] == "session" and [i["id"] for i in f["session"]["intents"]] == [item.pk])

    pause(proc, session)  # the cancel is requested but not applied yet
    assert do_stop_and_send(item).status == "accepted"
    first.until(lambda f: f["type"] == "session" and f["session"]["active_run_status"] == "cancelling")
    first.close()  # the socket drops mid-cancel

    second = live.socket(session.pk, cookie)
    second.subscribe({busy.pk: busy.last_seq})
    snapshot = second.session()
    assert [(i["id"], i["kind"], i["state"]) for i in snapshot["intents"]] == [
        (item.pk, IntentKind.STOP_AND_SEND, IntentState.STOPPING)
    ]
    assert (snapshot["active_run_id"], snapshot["active_run_status"]) == (busy.pk, RunStatus.CANCELLING)

    resume(proc)
    nxt = run_from(item)
    replacement = second.events_to_terminal(nxt.pk)
    assert_contiguous(replacement, 1)
    assert replacement[0]["type"] == "run.started" and replacement[-1]["payload"]["state"] == "completed"
    assert done_state(busy) == RunStatus.CANCELLED
    assert [r.pk for r in runs_of(session)] == [busy.pk, nxt.pk]
    assert nxt.source == RunSource.STOP_AND_SEND


def test_a_pending_stop_and_send_survives_a_refresh_during_cancel(
    runner: Proc, api: Client, session: Session
) -> None:
    busy = start_turn(session, "hold", started="token.delta")
    item = queue(session, "fast replace it")
    other = queue(session, "fast then this")
    pause(runner, session)
    assert do_stop_and_send(item).status == "accepted"

    refreshed = view(api, session)

    assert refreshed["active_run_id"] == busy.pk
    assert turn_of(refreshed, busy)["status"] == RunStatus.CANCELLING
    assert [(i["id"], i["kind"], i["state"]) for i in refreshed["intents"]] == [
        (item.pk, IntentKind.STOP_AND_SEND, IntentState.STOPPING),
        (other.pk, IntentKind.QUEUE, IntentState.WAITING),
    ]
    assert view(api, session) == refreshed  # a second refresh: the same state, nothing moved

    resume(runner)
    nxt = run_from(item)
    wait_status(nxt, RunStatus.COMPLETED, log=runner.log)
    after = view(api, session)
    assert [t["run_id"] for t in after["turns"]][:2] == [busy.pk, nxt.pk]
    assert turn_of(after, nxt)["source"] == RunSource.STOP_AND_SEND
    assert item.pk not in open_ids(after)
    settled(session)
    assert [r.prompt_text for r in runs_of(session)] == ["hold", "fast replace it", "fast then this"]


# ---------------------------------------------------------------- exactly once


def test_stop_and_send_pressed_twice_cancels_once_and_sends_once(
    runner: Proc, api: Client, session: Session
) -> None:
    busy = start_turn(session, "hold", started="token.delta")
    item = queue(session, "fast pressed twice")

    def press(_: int) -> str:
        try:
            return do_stop_and_send(PendingIntent.objects.get(pk=item.pk)).status
        finally:
            connection.close()

    with ThreadPoolExecutor(2) as pool:
        answers = sorted(pool.map(press, range(2)))

    assert answers == ["accepted", "duplicate"]
    wait_status(busy, RunStatus.CANCELLED, log=runner.log)
    nxt = run_from(item)
    wait_status(nxt, RunStatus.COMPLETED, log=runner.log)
    # A third press, after it has become the turn, is still the same answer.
    assert api.post(f"/api/intents/{item.pk}/stop-and-send").json()["status"] == "duplicate"
    assert Control.objects.filter(run=busy, kind=ControlKind.CANCEL).count() == 1
    assert [r.pk for r in runs_of(session)] == [busy.pk, nxt.pk]
    assert [e.payload["state"] for e in events(busy) if e.terminal] == [RunStatus.CANCELLED]
    assert types(nxt).count("run.started") == 1


def test_a_second_item_cannot_stop_and_send_while_another_replaces_the_run(
    runner: Proc, session: Session
) -> None:
    busy = start_turn(session, "hold", started="token.delta")
    first = queue(session, "fast first replacement")
    second = queue(session, "fast second in line")
    pause(runner, session)

    assert do_stop_and_send(first).status == "accepted"
    refused = do_stop_and_send(second)

    assert refused.status == "conflict" and "already replacing" in refused.message
    row = fresh(second)
    assert (row.kind, row.state, row.reason) == (IntentKind.QUEUE, IntentState.WAITING, refused.message)
    resume(runner)
    wait_status(busy, RunStatus.CANCELLED, log=runner.log)
    settled(session)
    assert [(r.prompt_text, r.source, r.status) for r in runs_of(session)] == [
        ("hold", RunSource.COMPOSER, RunStatus.CANCELLED),
        ("fast first replacement", RunSource.STOP_AND_SEND, RunStatus.COMPLETED),
        ("fast second in line", RunSource.QUEUE, RunStatus.COMPLETED),
    ]


def test_stop_and_send_before_the_run_started_cancels_it_unstarted_and_sends_the_item(
    runners: list[Proc], logs: Path, session: Session
) -> None:
    unstarted = send(session, "fast never started").run
    assert unstarted is not None
    item = queue(session, "fast sent instead")

    assert do_stop_and_send(item).status == "accepted"

    nxt = fresh(item).run
    assert nxt is not None and nxt.source == RunSource.STOP_AND_SEND
    assert done_state(unstarted) == RunStatus.CANCELLED and "run.started" not in types(unstarted)
    proc = spawn_runner(runners, logs, "late")
    wait_status(nxt, RunStatus.COMPLETED, log=proc.log)
    assert [r.pk for r in runs_of(session)] == [unstarted.pk, nxt.pk]
