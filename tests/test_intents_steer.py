"""Steer: guidance delivered to the active run, journaled, never a turn, never editable again.

Against a real runner and the bundled demo agent (`hold` streams, with chunk boundaries where a
steer lands, until the test releases it: tests/support/hold.py). The RFC's "Testing
Expectations" for steer each have a test here; docs/intents.md has the model.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.test import Client

from intents.models import IntentKind, IntentState, PendingIntent
from intents.services import (
    do_delete_intent,
    do_edit_intent,
    do_steer_failed,
    do_steer_intent,
    settle_after_run,
)
from projects.models import Session
from runs.controls import do_cancel, do_stop_and_send
from runs.journal import done_event
from runs.models import Control, ControlKind, Run, RunSource, RunStatus
from runs.services import do_submit_message
from runs.turns import finish_run
from tests import factories
from tests.support.hold import release
from tests.support.intents import (
    demo_agent_env,
    fresh,
    open_ids,
    queue,
    replay,
    run_from,
    runner,  # noqa: F401
    runs_of,
    send,
    settled,
    spawn_runner,
    start_turn,
    steer_items,
    steer_rows,
    switch_away_and_back,
    turn_of,
    view,
    wait_intent,
)
from tests.support.procs import Proc
from tests.support.runner import execution_of
from tests.support.runs import assert_journal_well_formed, state, wait_event, wait_status

pytestmark = pytest.mark.django_db(transaction=True)

JSON = "application/json"


@pytest.fixture(params=["slash", "extension"])
def steer_runner(request: pytest.FixtureRequest, runners: list[Proc], logs: Path) -> Proc:
    """A runner whose demo agent takes steer as a `/steer` prompt, or through `_session/steering`."""
    return spawn_runner(runners, logs, f"steer-{request.param}", HERMESWEB_DEMO_STEER=request.param)


def as_paged(state: dict[str, Any]) -> dict[str, Any]:
    """A turn's state as a transcript page may carry it: without the run's joined `text` and
    `reasoning`, which its items already hold (runs.transcript)."""
    return {key: value for key, value in state.items() if key not in ("text", "reasoning")}


def delivered_steer(session: Session, text: str) -> tuple[Run, PendingIntent]:
    """A held turn and a steer the agent has taken (journaled as steer.delivered); the test releases it."""
    run = start_turn(session, "hold", started="token.delta")
    result = send(session, text, mode="steer")
    assert result.kind == "steer" and result.run is None and result.intent is not None, result
    wait_event(run, "steer.delivered", text=text)
    return run, result.intent


# ---------------------------------------------------------------- RFC: Testing Expectations


def test_an_accepted_steer_stays_visible_after_a_session_switch_and_a_replay(
    runner: Proc, api: Client, session: Session
) -> None:
    run, intent = delivered_steer(session, "use the narrow scope")
    other = factories.SessionFactory(project=session.project)
    send(other, "fast something else entirely")

    before, elsewhere, after = switch_away_and_back(api, session, other)

    expected = [{"kind": "steer", "text": "use the narrow scope", "intent_id": intent.pk}]
    assert steer_items(turn_of(before, run)) == expected
    assert steer_items(turn_of(after, run)) == expected
    assert all(not steer_items(turn) for turn in elsewhere["turns"])
    release(session.project.path)
    wait_status(run, RunStatus.COMPLETED, log=runner.log)
    settled_view = view(api, session)
    assert steer_items(turn_of(settled_view, run)) == expected
    replayed = replay(api, run)
    assert as_paged(replayed) == as_paged(turn_of(settled_view, run)["state"])
    assert [item for item in replayed["items"] if item["kind"] == "steer"] == expected


def test_an_accepted_steer_is_not_duplicated_as_a_user_turn(
    steer_runner: Proc, api: Client, session: Session
) -> None:
    runner = steer_runner
    run, intent = delivered_steer(session, "prefer small diffs")
    # The same submission again (a retry after a dropped response) is the first answer, not a turn.
    again = do_submit_message(session, client_id=intent.client_id, text="prefer small diffs", mode="steer")
    assert (again.duplicate, again.kind, again.run) == (True, IntentKind.STEER, None)
    release(session.project.path)
    wait_status(run, RunStatus.COMPLETED, log=runner.log)
    settled(session)

    body = view(api, session)
    assert [turn["run_id"] for turn in body["turns"]] == [run.pk]
    assert body["turns"][0]["prompt_text"] == "hold"
    assert body["intents"] == []
    assert len(steer_rows(run)) == 1
    text = state(run)["text"]
    assert text.count("Steer received: prefer small diffs") == 1
    assert "Steer queued" not in text
    row = fresh(intent)
    assert (row.state, row.run_id, row.target_run_id) == (IntentState.DELIVERED, None, run.pk)


def test_an_accepted_steer_is_not_still_editable_as_a_queue_item(
    runner: Proc, api: Client, session: Session
) -> None:
    run, intent = delivered_steer(session, "keep the public API")
    current = wait_intent(intent, state=IntentState.DELIVERED)

    assert do_edit_intent(current, version=current.version, text="changed").status == "not_active"
    assert do_edit_intent(current, version=current.version, position=0).status == "not_active"
    assert do_delete_intent(current, version=current.version).status == "not_active"
    assert do_stop_and_send(current).status == "not_active"
    assert do_steer_intent(current).status == "duplicate"
    patched = api.patch(
        f"/api/intents/{intent.pk}", {"version": current.version, "text": "x"}, content_type=JSON
    )
    assert patched.status_code == 200 and patched.json()["status"] == "not_active"
    assert intent.pk not in open_ids(view(api, session))

    release(session.project.path)
    wait_status(run, RunStatus.COMPLETED, log=runner.log)
    row = fresh(intent)
    assert (row.kind, row.state, row.text, row.version) == (
        IntentKind.STEER,
        IntentState.DELIVERED,
        "keep the public API",
        current.version,
    )
    assert do_cancel(run).status == "not_active"
    assert runs_of(session) == [run]


def test_a_leftover_steer_converts_to_a_queued_item_with_source_metadata(
    runners: list[Proc], logs: Path, api: Client, session: Session
) -> None:
    doomed = spawn_runner(runners, logs, "doomed")
    run = start_turn(session, "hold", started="token.delta")
    doomed.kill9()
    # The run still looks active, so the steer is accepted for it — and its runner never delivers it.
    result = send(session, "also update the changelog", mode="steer")
    assert result.kind == "steer" and result.intent is not None
    intent = result.intent

    rescuer = spawn_runner(runners, logs, "rescuer")
    wait_status(run, RunStatus.INTERRUPTED, log=rescuer.log)
    row = fresh(intent)
    assert (row.kind, row.source) == (IntentKind.QUEUE, RunSource.LEFTOVER_STEER)
    assert row.source_meta["steer_run_id"] == run.pk
    assert "ended before this steer reached the agent" in row.reason
    assert row.text == "also update the changelog"
    control = Control.objects.get(run=run, kind=ControlKind.STEER)
    assert (control.state, control.result) == ("rejected", "expired")
    assert not steer_rows(run)

    nxt = run_from(intent)
    assert (nxt.source, nxt.prompt_text) == (RunSource.LEFTOVER_STEER, "also update the changelog")
    assert nxt.source_meta["intent_id"] == intent.pk and nxt.source_meta["steer_run_id"] == run.pk
    wait_status(nxt, RunStatus.COMPLETED, log=rescuer.log)
    assert "also update the changelog" in state(nxt)["text"]
    body = view(api, session)
    assert [(t["run_id"], t["source"]) for t in body["turns"]] == [
        (run.pk, RunSource.COMPOSER),
        (nxt.pk, RunSource.LEFTOVER_STEER),
    ]
    assert body["intents"] == []


def test_a_waiting_queue_item_upgrades_to_steer_and_the_upgrade_is_irreversible(
    steer_runner: Proc, api: Client, session: Session
) -> None:
    runner = steer_runner
    run = start_turn(session, "hold", started="token.delta")
    intent = queue(session, "check the edge cases too")

    upgraded = api.post(f"/api/intents/{intent.pk}/steer")

    assert upgraded.status_code == 200, upgraded.content
    assert (upgraded.json()["status"], upgraded.json()["intent"]["kind"]) == ("accepted", IntentKind.STEER)
    wait_event(run, "steer.delivered", intent_id=intent.pk)
    current = wait_intent(intent, state=IntentState.DELIVERED)
    assert api.post(f"/api/intents/{intent.pk}/steer").json()["status"] == "duplicate"
    assert do_edit_intent(current, version=current.version, text="back to queue?").status == "not_active"
    assert do_delete_intent(current).status == "not_active"
    assert do_stop_and_send(current).status == "not_active"
    release(session.project.path)
    wait_status(run, RunStatus.COMPLETED, log=runner.log)
    settled(session)
    row = fresh(intent)
    assert (row.kind, row.state, row.run_id) == (IntentKind.STEER, IntentState.DELIVERED, None)
    assert runs_of(session) == [run]  # it never drained as a turn
    assert "Steer received: check the edge cases too" in state(run)["text"]


def test_an_unavailable_steer_falls_back_to_the_queue_keeping_the_text_and_explaining_why(
    runner: Proc, api: Client, session: Session, settings: Any
) -> None:
    demo = settings.HERMESWEB_AGENTS["demo"]
    settings.HERMESWEB_AGENTS = {**settings.HERMESWEB_AGENTS, "demo": dataclasses.replace(demo, steer="none")}
    run = start_turn(session, "hold", started="token.delta")

    result = send(session, "narrow it down", mode="steer")

    assert result.kind == IntentKind.QUEUE and result.intent is not None
    intent = fresh(result.intent)
    assert intent.text == "narrow it down"
    assert "cannot take steer" in intent.reason and "stays queued" in intent.reason
    assert intent.source_meta == {"requested": "steer", "fallback": intent.reason}
    shown = view(api, session)["intents"]
    assert [(i["id"], i["text"], i["reason"]) for i in shown] == [
        (intent.pk, "narrow it down", intent.reason)
    ]
    # Upgrading it later is refused the same way, and it stays queued.
    refused = api.post(f"/api/intents/{intent.pk}/steer")
    assert refused.status_code == 409 and refused.json()["code"] == "conflict"
    assert "cannot take steer" in refused.json()["details"]["intent"]["reason"]
    assert (fresh(intent).kind, fresh(intent).state) == (IntentKind.QUEUE, IntentState.WAITING)
    assert not Control.objects.filter(kind=ControlKind.STEER).exists()

    assert do_cancel(run).status == "accepted"
    nxt = run_from(intent)
    assert (nxt.source, nxt.prompt_text) == (RunSource.QUEUE, "narrow it down")
    wait_status(nxt, RunStatus.COMPLETED, log=runner.log)
    assert not steer_rows(run)


def test_a_steer_the_runner_cannot_deliver_falls_back_to_the_queue_with_its_text_and_reason(
    runners: list[Proc], logs: Path, api: Client, session: Session
) -> None:
    # The web process believes the agent takes steer; the runner's agent is configured not to.
    proc = spawn_runner(runners, logs, "nosteer", HERMESWEB_AGENTS=demo_agent_env(steer="none"))
    run = start_turn(session, "hold", started="token.delta")

    result = send(session, "narrow it down", mode="steer")
    assert result.kind == IntentKind.STEER and result.intent is not None

    intent = wait_intent(result.intent, kind=IntentKind.QUEUE)
    assert intent.text == "narrow it down" and intent.state == IntentState.WAITING
    assert "cannot take steer" in intent.reason and "stays queued" in intent.reason
    assert "cannot take steer" in intent.source_meta["steer_failed"]
    control = Control.objects.get(run=run, kind=ControlKind.STEER)
    assert (control.state, control.result) == ("rejected", "conflict")
    assert [(i["id"], i["reason"]) for i in view(api, session)["intents"]] == [(intent.pk, intent.reason)]
    assert not steer_rows(run)

    assert do_cancel(run).status == "accepted"
    nxt = run_from(intent)
    assert (nxt.source, nxt.prompt_text) == (RunSource.QUEUE, "narrow it down")
    wait_status(nxt, RunStatus.COMPLETED, log=proc.log)


def test_upgrading_to_steer_after_the_run_ended_is_a_conflict_and_the_item_stays_queued(
    runner: Proc, api: Client, session: Session
) -> None:
    first = start_turn(session, "hold", started="token.delta")
    second_item = queue(session, "hold second turn")
    third_item = queue(session, "fast third turn")
    release(session.project.path)  # `first` ends; the second item, held too, starts after it
    wait_status(first, RunStatus.COMPLETED, log=runner.log)
    second = run_from(second_item)
    wait_event(second, "token.delta")

    # The tab still showed `first` running when the user pressed Steer on the third item.
    answer = do_steer_intent(fresh(third_item), run_id=first.pk)

    assert answer.status == "conflict" and "has ended" in answer.message
    row = fresh(third_item)
    assert (row.kind, row.state, row.text, row.reason) == (
        IntentKind.QUEUE,
        IntentState.WAITING,
        "fast third turn",
        answer.message,
    )
    assert [(i["id"], i["reason"]) for i in view(api, session)["intents"]] == [(row.pk, answer.message)]
    assert not Control.objects.filter(kind=ControlKind.STEER).exists()
    assert do_cancel(second).status == "accepted"
    third = run_from(third_item)
    assert (third.source, third.prompt_text) == (RunSource.QUEUE, "fast third turn")
    wait_status(third, RunStatus.COMPLETED, log=runner.log)
    for run in (first, second, third):
        assert_journal_well_formed(run)


# ---------------------------------------------------------------- database-level edges


@pytest.mark.django_db
def test_a_steer_that_fell_back_to_the_queue_can_be_upgraded_again_on_the_same_run(session: Session) -> None:
    run = factories.RunFactory(session=session, status=RunStatus.RUNNING)
    intent = factories.PendingIntentFactory(session=session)
    assert do_steer_intent(intent).status == "accepted"
    first = Control.objects.get(run=run, kind=ControlKind.STEER)
    do_steer_failed(first.pk, intent.pk, "The agent was busy.")
    assert fresh(intent).kind == IntentKind.QUEUE

    again = do_steer_intent(fresh(intent))

    assert again.status == "accepted"
    pending = Control.objects.filter(run=run, kind=ControlKind.STEER, state="pending")
    assert [c.target_id for c in pending] == [str(intent.pk)]


@pytest.mark.django_db
def test_leftover_steers_go_to_the_front_of_the_queue_in_the_order_they_were_sent(session: Session) -> None:
    run = factories.RunFactory(session=session, status=RunStatus.RUNNING)
    waiting = factories.PendingIntentFactory(session=session, text="queued", position=0)
    first = factories.PendingIntentFactory(session=session, text="steer one", position=1)
    second = factories.PendingIntentFactory(session=session, text="steer two", position=2)
    for intent in (first, second):
        assert do_steer_intent(intent).status == "accepted"
    Run.objects.filter(pk=run.pk).update(status=RunStatus.COMPLETED)

    settle_after_run(session, run)

    order = PendingIntent.objects.filter(session=session).waiting().order_by("position", "id")
    assert [(i.text, i.source) for i in order] == [
        ("steer one", RunSource.LEFTOVER_STEER),
        ("steer two", RunSource.LEFTOVER_STEER),
        ("queued", "composer"),
    ]
    assert fresh(waiting).version == 2  # it moved, so a tab holding version 1 must re-read it


def test_a_steer_applied_after_the_agent_answered_the_turn_is_left_over_not_sent(session: Session) -> None:
    run = factories.RunFactory(session=session, status=RunStatus.RUNNING)
    intent = factories.PendingIntentFactory(session=session, text="too late")
    assert do_steer_intent(intent).status == "accepted"
    control = Control.objects.get(run=run, kind=ControlKind.STEER)
    sent: list[Any] = []
    execution = execution_of(run)

    async def call(request: Any, timeout: float | None = None) -> None:
        return None

    conn = SimpleNamespace(prompt=lambda **request: sent.append(request))
    execution.process = SimpleNamespace(capabilities={"steer": "slash"}, conn=conn, call=call)
    execution.agent_session_id = "agent-session"
    execution.prompt_sent.set()
    execution.turn_over = True  # the agent has answered the turn's prompt

    asyncio.run(execution.apply_control(control))

    # An idle agent would run `/steer too late` as an untracked prompt: nothing is sent.
    assert sent == []
    assert Control.objects.get(pk=control.pk).state == "pending"
    finish_run(run.pk, [done_event(RunStatus.COMPLETED)])
    row = fresh(intent)
    assert (row.kind, row.source, row.state) == (
        IntentKind.QUEUE,
        RunSource.LEFTOVER_STEER,
        IntentState.DISPATCHED,
    )
    assert Control.objects.get(pk=control.pk).result == "expired"
