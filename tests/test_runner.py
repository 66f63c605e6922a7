"""The runner executes runs outside the web process, with the real demo agent.

Every test here starts real `manage.py runner` subprocesses against the test
database; the demo agent is a real ACP process spawned by the runner.
"""

from __future__ import annotations

import signal
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction

from runs.controls import do_cancel, do_respond_approval, do_respond_clarify
from runs.models import Run, RunStatus
from tests import factories
from tests.support.hold import release
from tests.support.procs import Proc, start_runner, wait_for
from tests.support.runs import (
    assert_journal_well_formed,
    events,
    refreshed,
    run_of,
    state,
    submit,
    types,
    wait_event,
    wait_status,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def runner(runners: list[Proc], logs: Path) -> Proc:
    proc = start_runner(logs, "r1", HERMESWEB_DEMO_DELAY="0.005")
    runners.append(proc)
    return proc


@pytest.fixture
def session(db: None) -> Any:
    return factories.SessionFactory(project__agent="demo")


def test_a_run_completes_with_the_expected_event_sequence(runner: Proc, session: Any) -> None:
    run = run_of(submit(session, "show me a tool please"))
    wait_status(run, RunStatus.COMPLETED, log=runner.log)
    assert_journal_well_formed(run)
    seen = types(run)
    assert seen[0] == "run.started"
    assert (
        seen.index("tool.started") < seen.index("tool.done") < seen.index("usage.final") < seen.index("done")
    )
    assert "token.delta" in seen
    final = state(run)
    assert final["terminal_state"] == "completed"
    assert final["tools"] and all(t.get("done") for t in final["tools"].values())
    assert refreshed(run).stop_reason == "end_turn"
    session.refresh_from_db()
    assert session.agent_session_id
    assert session.title  # the demo agent titles the first turn
    assert any(c["name"] == "steer" for c in session.commands)


def test_the_agents_commands_are_written_once_not_at_every_turn(runner: Proc, session: Any) -> None:
    first = run_of(submit(session, "fast one"))
    wait_status(first, RunStatus.COMPLETED, log=runner.log)
    session.refresh_from_db()
    assert any(c["name"] == "steer" for c in session.commands)
    # A marker only a rewrite would replace: the agent sends the same commands again.
    type(session).objects.filter(pk=session.pk).update(commands=[{"name": "marker"}])
    second = run_of(submit(session, "fast two"))
    wait_status(second, RunStatus.COMPLETED, log=runner.log)
    session.refresh_from_db()
    assert session.commands == [{"name": "marker"}]


def test_token_deltas_are_coalesced_into_fewer_rows_than_chunks(runner: Proc, session: Any) -> None:
    run = run_of(submit(session, "fast please answer"))  # `fast`: all chunks at once
    wait_status(run, RunStatus.COMPLETED, log=runner.log)
    deltas = [e for e in events(run) if e.type == "token.delta"]
    text = state(run)["text"]
    assert "Demo answer" in text
    # The demo streams a few words per chunk: dozens of chunks, coalesced into a handful of rows.
    assert len(deltas) < len(text.split()) / 3


def test_cancel_mid_stream_keeps_partial_text_and_ends_cancelled_once(runner: Proc, session: Any) -> None:
    run = run_of(submit(session, "hold"))
    wait_event(run, "token.delta")
    # Both in one transaction: the runner is rung only at its commit, so the repeat meets the
    # pending cancel rather than, on a quick runner, the run already ended (`not_active`).
    with transaction.atomic():
        first = do_cancel(run)
        again = do_cancel(run)
    assert (first.status, again.status) == ("accepted", "duplicate")
    wait_status(run, RunStatus.CANCELLED, log=runner.log)
    assert_journal_well_formed(run)
    final = state(run)
    assert final["terminal_state"] == "cancelled"
    assert "Held chunk" in final["text"]
    assert do_cancel(refreshed(run)).status == "not_active"


@pytest.mark.parametrize(("option", "written"), [("allow_once", True), ("deny", False)])
def test_an_approval_answer_reaches_the_agent_and_its_effect_shows_on_disk(
    runner: Proc, session: Any, option: str, written: bool
) -> None:
    run = run_of(submit(session, "approve"))
    wait_status(run, RunStatus.AWAITING_APPROVAL, log=runner.log)
    request = wait_event(run, "approval.requested")
    names = {o["option_id"]: o["name"] for o in request.payload["options"]}
    assert names["allow_once"] == "Allow once" and names["deny"] == "Deny"
    approval_id = request.payload["approval_id"]
    assert do_respond_approval(run, approval_id, option).status == "accepted"
    assert do_respond_approval(run, approval_id, option).status == "duplicate"
    wait_status(run, RunStatus.COMPLETED, log=runner.log)
    resolved = wait_event(run, "approval.resolved", approval_id=approval_id)
    assert resolved.payload["option_id"] == option
    assert (Path(session.project.path) / "approved.txt").exists() is written
    assert do_respond_approval(refreshed(run), approval_id, option).status in ("duplicate", "expired")


def test_a_clarify_answer_reaches_the_agent(runner: Proc, session: Any) -> None:
    run = run_of(submit(session, "ask me"))
    wait_status(run, RunStatus.AWAITING_CLARIFY, log=runner.log)
    request = wait_event(run, "clarify.requested")
    assert request.payload["question"] == "Which colour should I use?"
    assert do_respond_clarify(run, request.payload["clarify_id"], "teal").status == "accepted"
    wait_status(run, RunStatus.COMPLETED, log=runner.log)
    assert "You answered: teal" in state(run)["text"]


def test_cancel_while_awaiting_approval_never_grants_it(runner: Proc, session: Any) -> None:
    run = run_of(submit(session, "approve"))
    wait_status(run, RunStatus.AWAITING_APPROVAL, log=runner.log)
    assert do_cancel(run).status == "accepted"
    wait_status(run, RunStatus.CANCELLED, log=runner.log)
    assert_journal_well_formed(run)
    resolved = wait_event(run, "approval.resolved")
    assert resolved.payload["outcome"] == "cancelled"
    assert not (Path(session.project.path) / "approved.txt").exists()


def test_steer_during_a_tool_loop_is_delivered_and_journaled(runner: Proc, session: Any) -> None:
    run = run_of(submit(session, "toolloop"))
    wait_event(run, "tool.started")
    steer = submit(session, "prefer the narrow scope", mode="steer")
    assert steer.kind == "steer" and steer.run is None
    delivered = wait_event(run, "steer.delivered")
    assert delivered.payload["text"] == "prefer the narrow scope"
    wait_status(run, RunStatus.COMPLETED, log=runner.log)
    text = state(run)["text"]
    assert "Steer received: prefer the narrow scope" in text
    assert "Steer queued" not in text  # the agent's acknowledgement is not part of the turn
    assert steer.intent is not None
    steer.intent.refresh_from_db()
    assert steer.intent.state == "delivered"
    assert Run.objects.filter(session=session).count() == 1  # a steer is never a turn


def test_a_message_queued_during_a_run_drains_as_the_next_turn(runner: Proc, session: Any) -> None:
    first = run_of(submit(session, "hold"))
    wait_event(first, "token.delta")
    queued = submit(session, "then this", mode="queue")
    assert queued.kind == "queue" and queued.run is None
    release(session.project.path)
    wait_status(first, RunStatus.COMPLETED, log=runner.log)
    assert queued.intent is not None
    nxt = wait_for(lambda: Run.objects.filter(session=session, source="queue").first(), what="drained run")
    wait_status(nxt, RunStatus.COMPLETED, log=runner.log)
    assert "then this" in state(nxt)["text"]
    queued.intent.refresh_from_db()
    assert queued.intent.state == "dispatched" and queued.intent.run_id == nxt.pk


def test_an_agent_crash_fails_the_run_and_the_session_goes_on(runner: Proc, session: Any) -> None:
    crashed = run_of(submit(session, "crash"))
    wait_status(crashed, RunStatus.FAILED, log=runner.log)
    assert_journal_well_formed(crashed)
    error = wait_event(crashed, "error")
    assert error.payload["code"] == "agent_died"
    after = run_of(submit(session, "still there?"))
    wait_status(after, RunStatus.COMPLETED, log=runner.log)
    assert "still there?" in state(after)["text"]


def test_kill_9_of_the_runner_interrupts_its_run_and_a_new_runner_serves_queued_runs(
    runners: list[Proc], logs: Path, db: None
) -> None:
    first = start_runner(logs, "doomed", HERMESWEB_DEMO_DELAY="0.05")
    runners.append(first)
    busy = factories.SessionFactory(project__agent="demo")
    other = factories.SessionFactory(project=busy.project)
    held = run_of(submit(busy, "hold"))
    wait_event(held, "token.delta")
    first.kill9()
    waiting = run_of(submit(other, "answer after the outage"))
    assert refreshed(waiting).status == RunStatus.QUEUED
    second = start_runner(logs, "rescuer", HERMESWEB_DEMO_DELAY="0.005")
    runners.append(second)
    wait_status(held, RunStatus.INTERRUPTED, log=second.log)
    assert_journal_well_formed(held)
    done = events(held)[-1]
    assert done.payload["state"] == "interrupted" and "doomed" in done.payload["reason"]
    assert "Held chunk" in state(held)["text"]  # what was journaled before the crash stays
    wait_status(waiting, RunStatus.COMPLETED, log=second.log)
    # Never retried: the interrupted run has exactly one run.started.
    assert types(held).count("run.started") == 1


def test_the_next_turn_after_a_runner_restart_reloads_the_agent_session(
    runners: list[Proc], logs: Path, session: Any
) -> None:
    first = start_runner(logs, "before", HERMESWEB_DEMO_DELAY="0.005")
    runners.append(first)
    one = run_of(submit(session, "remember the word papaya"))
    wait_status(one, RunStatus.COMPLETED, log=first.log)
    assert first.stop() == 0
    agent_session = refreshed(one).session.agent_session_id
    second = start_runner(logs, "after", HERMESWEB_DEMO_DELAY="0.005")
    runners.append(second)
    two = run_of(submit(session, "what was the word"))
    wait_status(two, RunStatus.COMPLETED, log=second.log)
    session.refresh_from_db()
    assert session.agent_session_id == agent_session  # reloaded, not replaced
    text = state(two)["text"]
    assert "what was the word" in text
    assert "papaya" not in text  # the load's history replay is not journaled again


def test_sigterm_lets_a_running_turn_finish_and_exits_zero(
    runners: list[Proc], logs: Path, session: Any
) -> None:
    proc = start_runner(logs, "graceful", HERMESWEB_DEMO_DELAY="0.005", HERMESWEB_SHUTDOWN_GRACE_SECONDS="20")
    runners.append(proc)
    run = run_of(submit(session, "hold"))
    wait_event(run, "token.delta")
    proc.signal(signal.SIGTERM)
    # Released once the runner is draining: the turn is still running when the signal lands.
    wait_for(lambda: "no new claims" in proc.log(), what="the runner to start draining")
    release(session.project.path)
    assert proc.stop() == 0
    assert refreshed(run).status == RunStatus.COMPLETED


def test_sigterm_interrupts_what_outlasts_the_grace_period(
    runners: list[Proc], logs: Path, session: Any
) -> None:
    proc = start_runner(
        logs, "impatient", HERMESWEB_DEMO_DELAY="0.05", HERMESWEB_SHUTDOWN_GRACE_SECONDS="0.5"
    )
    runners.append(proc)
    run = run_of(submit(session, "hold"))
    wait_event(run, "token.delta")
    proc.signal(signal.SIGTERM)
    assert proc.stop() == 0
    assert refreshed(run).status == RunStatus.INTERRUPTED
    assert_journal_well_formed(run)
    assert events(run)[-1].payload["code"] == "runner_shutdown"


@pytest.mark.postgres
def test_two_runners_never_execute_the_same_run_nor_two_runs_of_one_session(
    runners: list[Proc], logs: Path, db: None
) -> None:
    for name in ("a", "b"):
        runners.append(start_runner(logs, name, HERMESWEB_DEMO_DELAY="0.002"))
    project = factories.ProjectFactory(agent="demo")
    sessions = [factories.SessionFactory(project=project) for _ in range(6)]
    runs = []
    for round_ in range(3):
        for session in sessions:
            runs.append(submit(session, f"fast round {round_}", mode="queue"))
    wait_for(
        lambda: Run.objects.filter(session__project=project, status=RunStatus.COMPLETED).count() == len(runs),
        90,
        what="all runs to complete",
    )
    by_runner: dict[str, int] = {}
    for run in Run.objects.filter(session__project=project):
        started = [e for e in events(run) if e.type == "run.started"]
        assert len(started) == 1
        by_runner[started[0].payload["runner"]] = by_runner.get(started[0].payload["runner"], 0) + 1
        assert_journal_well_formed(run)
    for session in sessions:
        spans = sorted(Run.objects.filter(session=session).values_list("started_at", "finished_at"))
        for (_, end), (start, _) in pairwise(spans):
            assert end <= start, "two runs of one session overlapped"
    assert set(by_runner) == {"a", "b"}, by_runner


def test_steer_reaches_an_agent_that_advertises_the_session_steering_extension(
    runners: list[Proc], logs: Path, db: None, settings: Any
) -> None:
    from runs.agents import load_agents

    env = {"HERMESWEB_DEMO_STEER": "extension", "HERMESWEB_DEMO_DELAY": "0.005"}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        settings.HERMESWEB_AGENTS = load_agents(settings.DATA_DIR)
    assert settings.HERMESWEB_AGENTS["demo"].steer == "extension"
    runners.append(start_runner(logs, "extension", **env))
    session = factories.SessionFactory(project__agent="demo")
    run = run_of(submit(session, "hold"))
    wait_event(run, "token.delta")
    steer = submit(session, "keep it short", mode="steer")
    delivered = wait_event(run, "steer.delivered")
    assert delivered.payload["text"] == "keep it short"
    release(session.project.path)
    wait_status(run, RunStatus.COMPLETED, log=runners[-1].log)
    assert "Steer received: keep it short" in state(run)["text"]
    assert steer.intent is not None
    steer.intent.refresh_from_db()
    assert steer.intent.state == "delivered"


def test_a_steer_sent_while_the_agent_starts_waits_for_the_turn(runner: Proc, session: Any) -> None:
    run = run_of(submit(session, "hold"))
    wait_event(run, "run.started")  # claimed; the agent process and session are still opening
    steer = submit(session, "early guidance", mode="steer")
    assert steer.kind == "steer"
    delivered = wait_event(run, "steer.delivered")
    assert delivered.payload["text"] == "early guidance"
    release(session.project.path)
    wait_status(run, RunStatus.COMPLETED, log=runner.log)
    assert steer.intent is not None
    steer.intent.refresh_from_db()
    assert steer.intent.state == "delivered"


@pytest.mark.django_db
def test_a_finished_turn_does_not_unregister_the_next_turn_of_its_agent_session() -> None:
    # A drained queue item can be claimed and registered for the same agent session
    # before the previous turn's execution has finished tearing down.
    import asyncio
    from types import SimpleNamespace

    from tests.support.runner import StubHost, execution_of

    host = StubHost()
    previous = execution_of(factories.RunFactory(status=RunStatus.COMPLETED), host)
    following = object()
    released: list[str] = []  # agent sessions whose ACP terminals were released (terminals.py)
    terminals = SimpleNamespace(release_session=released.append)
    previous.process = SimpleNamespace(sinks={"agent-session": following}, runs=set(), terminals=terminals)  # type: ignore[assignment]
    previous.agent_session_id = "agent-session"
    asyncio.run(previous.release_agent())
    assert previous.process.sinks == {"agent-session": following}
    assert host.pool.released == [previous.process]
    assert released == []  # the next turn's terminals are its own

    # Its own registration it removes, and its terminals with it.
    previous.process.sinks = {"agent-session": previous}
    asyncio.run(previous.release_agent())
    assert previous.process.sinks == {}
    assert released == ["agent-session"]
