"""Queue: messages sent while a run is active wait in the database and drain as turns, exactly once.

Against a real runner and the bundled demo agent, except the purely
database-level checks (versions, the drain's transaction). docs/intents.md
has the state machine and the exactly-once argument.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction
from django.test import Client

from intents.models import IntentKind, IntentState
from intents.services import do_edit_intent
from projects.models import Project, Session
from runs.controls import do_stop_and_send
from runs.journal import AlreadyTerminal, NewEvent, done_event
from runs.models import Control, ControlKind, Run, RunSource, RunStatus
from runs.turns import finish_run
from tests import factories
from tests.support.hold import release
from tests.support.intents import (
    fresh,
    open_ids,
    queue,
    run_from,
    runner,  # noqa: F401
    runs_of,
    send,
    settled,
    spawn_runner,
    start_turn,
    steer_rows,
    switch_away_and_back,
    view,
)
from tests.support.procs import Proc, wait_for
from tests.support.runner import claim_next
from tests.support.runs import assert_journal_well_formed, refreshed, state, types, wait_event, wait_status

pytestmark = pytest.mark.django_db(transaction=True)

JSON = "application/json"


def set_running_default(session: Session, value: str) -> None:
    # `update` bypasses the field's choices, as a row written by an older version would.
    Project.objects.filter(pk=session.project_id).update(running_default=value)


def assert_drained_once(session: Session, prompts: list[str]) -> list[Run]:
    """The session's turns after the first are exactly `prompts`, in order, each from one intent, run once."""
    runs = runs_of(session)
    assert [r.prompt_text for r in runs[1:]] == prompts
    for run in runs:
        assert refreshed(run).status == RunStatus.COMPLETED, (run.pk, run.status)
        assert_journal_well_formed(run)
        assert types(run).count("run.started") == 1
    for run in runs[1:]:
        intent = run.from_intent
        assert intent.state == IntentState.DISPATCHED and run.source_meta["intent_id"] == intent.pk
    for earlier, later in pairwise(runs):
        assert earlier.finished_at <= later.started_at, "two turns of one session overlapped"
    return runs


# ---------------------------------------------------------------- RFC: Testing Expectations


def test_a_queued_message_stays_scoped_to_its_session_across_switches(
    runner: Proc, api: Client, session: Session
) -> None:
    busy = start_turn(session, "hold", started="token.delta")
    item = queue(session, "fast then summarise")
    other = factories.SessionFactory(project=session.project)

    before, elsewhere, after = switch_away_and_back(api, session, other)

    assert open_ids(before) == open_ids(after) == [item.pk]
    assert elsewhere["intents"] == [] and elsewhere["turns"] == []
    # Sending in the other session while this one is busy starts a turn there and takes nothing from here.
    theirs = send(other, "fast hello from the other session")
    assert theirs.kind == "run" and theirs.run is not None
    wait_status(theirs.run, RunStatus.COMPLETED, log=runner.log)
    assert open_ids(view(api, session)) == [item.pk]
    release(session.project.path)
    wait_status(busy, RunStatus.COMPLETED, log=runner.log)
    mine = run_from(item)
    assert (mine.session_id, mine.source, mine.prompt_text) == (session.pk, RunSource.QUEUE, item.text)
    wait_status(mine, RunStatus.COMPLETED, log=runner.log)
    assert [r.prompt_text for r in runs_of(other)] == ["fast hello from the other session"]
    assert view(api, other)["intents"] == []


# ---------------------------------------------------------------- mode and running_default


@pytest.mark.parametrize("default", ["queue", "steer"])
def test_a_message_sent_while_running_with_mode_auto_follows_the_projects_running_default(
    runner: Proc, session: Session, default: str
) -> None:
    set_running_default(session, default)
    busy = start_turn(session, "hold", started="token.delta")
    other_mode = "steer" if default == "queue" else "queue"

    auto = send(session, f"fast auto follows {default}")
    explicit = send(session, f"fast explicit {other_mode}", mode=other_mode)

    assert auto.kind == default and explicit.kind == other_mode
    steered, queued = (auto, explicit) if default == "steer" else (explicit, auto)
    assert steered.intent is not None and queued.intent is not None
    wait_event(busy, "steer.delivered", intent_id=steered.intent.pk)
    release(session.project.path)
    wait_status(busy, RunStatus.COMPLETED, log=runner.log)
    settled(session)
    assert [r.prompt_text for r in runs_of(session)] == ["hold", queued.intent.text]
    assert runs_of(session)[1].source == RunSource.QUEUE
    assert [e.payload["text"] for e in steer_rows(busy)] == [steered.intent.text]


def test_a_legacy_interrupt_default_queues_and_leaves_the_interrupt_to_stop_and_send(
    runner: Proc, api: Client, session: Session
) -> None:
    refused = api.patch(f"/api/projects/{session.project_id}", {"running_default": "interrupt"}, JSON)
    assert refused.status_code == 422  # no longer a default one can choose
    set_running_default(session, "interrupt")  # but a row saved by an older version may still say so
    busy = start_turn(session, "hold", started="token.delta")

    result = send(session, "fast do this instead")

    assert result.kind == IntentKind.QUEUE and result.intent is not None
    assert refreshed(busy).status == RunStatus.RUNNING
    assert not Control.objects.filter(run=busy, kind=ControlKind.CANCEL).exists()
    assert do_stop_and_send(result.intent).status == "accepted"
    wait_status(busy, RunStatus.CANCELLED, log=runner.log)
    nxt = run_from(result.intent)
    assert (nxt.source, nxt.prompt_text) == (RunSource.STOP_AND_SEND, "fast do this instead")
    wait_status(nxt, RunStatus.COMPLETED, log=runner.log)


# ---------------------------------------------------------------- editing


@pytest.mark.django_db
def test_two_tabs_editing_one_item_the_stale_edit_gets_conflict_with_the_current_item(
    api: Client, user: Any, session: Session
) -> None:
    factories.RunFactory(session=session, status=RunStatus.RUNNING)
    item = queue(session, "original text")
    other_tab = Client()
    other_tab.force_login(user)
    url = f"/api/intents/{item.pk}"
    seen = other_tab.get(f"/api/sessions/{session.pk}/intents").json()["intents"][0]["version"]
    assert api.get(f"/api/sessions/{session.pk}/intents").json()["intents"][0]["version"] == seen

    first = api.patch(url, {"version": seen, "text": "from tab one"}, content_type=JSON)
    second = other_tab.patch(url, {"version": seen, "text": "from tab two"}, content_type=JSON)

    assert first.status_code == 200 and first.json()["intent"]["version"] == seen + 1
    assert second.status_code == 409 and second.json()["code"] == "conflict"
    current = second.json()["details"]["intent"]
    assert (current["text"], current["version"]) == ("from tab one", seen + 1)
    # The second tab redraws from the answer and retries with the version it now holds.
    retried = other_tab.patch(url, {"version": current["version"], "text": "from tab two"}, content_type=JSON)
    assert retried.status_code == 200
    stale_delete = api.delete(f"{url}?version={seen + 1}")
    assert stale_delete.status_code == 409
    assert stale_delete.json()["details"]["intent"]["text"] == "from tab two"
    assert (fresh(item).text, fresh(item).state) == ("from tab two", IntentState.WAITING)


def test_reordered_items_drain_in_their_new_order_each_exactly_once(
    runner: Proc, api: Client, session: Session
) -> None:
    start_turn(session, "hold", started="token.delta")
    a, b, c = (queue(session, f"fast item {name}") for name in "abc")

    moved = do_edit_intent(fresh(c), version=fresh(c).version, position=0)

    assert moved.status == "accepted"
    assert open_ids(view(api, session)) == [c.pk, a.pk, b.pk]
    release(session.project.path)
    settled(session)
    runs = assert_drained_once(session, ["fast item c", "fast item a", "fast item b"])
    assert {r.source for r in runs[1:]} == {RunSource.QUEUE}
    for run in runs[1:]:
        assert run.prompt_text in state(run)["text"]


# ---------------------------------------------------------------- exactly once, across crashes


@pytest.mark.django_db
def test_the_next_item_is_dispatched_in_the_terminal_events_transaction(session: Session) -> None:
    run = factories.RunFactory(session=session, status=RunStatus.RUNNING)
    item = queue(session, "next")

    class Crash(Exception):
        pass

    with pytest.raises(Crash), transaction.atomic():
        finish_run(run.pk, [done_event(RunStatus.COMPLETED)])
        assert fresh(item).state == IntentState.DISPATCHED
        raise Crash  # the process dies before the commit: neither happened

    assert (refreshed(run).status, refreshed(run).last_seq) == (RunStatus.RUNNING, 0)
    assert fresh(item).state == IntentState.WAITING and runs_of(session) == [run]
    finish_run(run.pk, [done_event(RunStatus.COMPLETED)])
    nxt = fresh(item).run
    assert nxt is not None and (nxt.status, nxt.source) == (RunStatus.QUEUED, RunSource.QUEUE)
    with pytest.raises(AlreadyTerminal):
        finish_run(run.pk, [done_event(RunStatus.INTERRUPTED)])
    assert runs_of(session) == [run, nxt]


def test_a_process_dying_right_after_the_terminal_event_loses_no_queued_item(
    runners: list[Proc], logs: Path, session: Session
) -> None:
    first = send(session, "fast first").run
    assert first is not None
    assert claim_next("ghost") == first.pk
    item = queue(session, "fast second")
    # What the ghost runner wrote just before it died: the turn's end, nothing after it.
    finish_run(first.pk, [NewEvent("run.started", {"status": "running"}), done_event(RunStatus.COMPLETED)])

    nxt = fresh(item).run
    assert nxt is not None and nxt.status == RunStatus.QUEUED
    proc = spawn_runner(runners, logs, "next")
    wait_status(nxt, RunStatus.COMPLETED, log=proc.log)
    assert types(nxt).count("run.started") == 1
    assert runs_of(session) == [first, nxt]


def test_queued_items_survive_a_runner_crash_and_drain_exactly_once(
    runners: list[Proc], logs: Path, api: Client, session: Session
) -> None:
    doomed = spawn_runner(runners, logs, "doomed")
    busy = start_turn(session, "hold", started="token.delta")
    a = queue(session, "fast after the outage")
    b = queue(session, "fast and then me")

    doomed.kill9()

    assert open_ids(view(api, session)) == [a.pk, b.pk]
    rescuer = spawn_runner(runners, logs, "rescuer")
    wait_status(busy, RunStatus.INTERRUPTED, log=rescuer.log)
    settled(session)
    runs = runs_of(session)
    assert [r.prompt_text for r in runs] == ["hold", "fast after the outage", "fast and then me"]
    for run in runs[1:]:
        assert refreshed(run).status == RunStatus.COMPLETED
        assert types(run).count("run.started") == 1
    assert types(busy).count("run.started") == 1  # never re-prompted
    assert_journal_well_formed(busy)


@pytest.mark.postgres
def test_two_runners_drain_many_queued_items_across_sessions_each_exactly_once_in_order(
    runners: list[Proc], logs: Path, project: Project
) -> None:
    sessions = [factories.SessionFactory(project=project) for _ in range(6)]
    expected: dict[int, list[str]] = {}
    for n, session in enumerate(sessions):
        assert send(session, f"fast first of {n}").run is not None
        items = [queue(session, f"fast item {i} of {n}") for i in range(4)]
        if n % 2:
            # Odd sessions reorder: the drain follows positions, not creation order.
            do_edit_intent(fresh(items[-1]), version=fresh(items[-1]).version, position=0)
            items = [items[-1], *items[:-1]]
        expected[session.pk] = [item.text for item in items]

    for name in ("a", "b"):
        spawn_runner(runners, logs, name, HERMESWEB_DEMO_DELAY="0.002")
    wait_for(
        lambda: (
            not Run.objects.filter(session__project=project).active().exists()
            and Run.objects.filter(session__project=project).count() == 6 * 5
        ),
        120,
        what="every queued item to drain",
    )

    by_runner: dict[str, int] = {}
    for session in sessions:
        runs = assert_drained_once(session, expected[session.pk])
        for run in runs:
            started = [e for e in run.events.all() if e.type == "run.started"]
            by_runner[started[0].payload["runner"]] = by_runner.get(started[0].payload["runner"], 0) + 1
    assert set(by_runner) == {"a", "b"}, by_runner
