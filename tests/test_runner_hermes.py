"""The runner against the real Hermes Agent (`hermes-acp`), offline.

Hermes runs in its own virtualenv (bin/setup-hermes) and talks to a scripted
OpenAI-compatible server owned by the test, on 127.0.0.1. The runner is a real
subprocess; the agent entry reaches it through HERMESWEB_AGENTS.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runs.controls import do_cancel, do_respond_approval
from runs.models import RunStatus
from tests import factories
from tests.support.hermes import AgentConfig
from tests.support.procs import Proc, start_runner, wait_for
from tests.support.runs import assert_journal_well_formed, run_of, state, submit, wait_event, wait_status
from tests.support.scripted_llm import ScriptedLLM, request_text, text, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.hermes]


@pytest.fixture
def agents_env(hermes_agent_config: AgentConfig) -> dict[str, str]:
    spec = {**hermes_agent_config, "cumulative_usage": True, "steer": "slash"}
    return {"HERMESWEB_AGENTS": json.dumps({"hermes": spec})}


@pytest.fixture
def runner(runners: list[Proc], logs: Path, agents_env: dict[str, str]) -> Proc:
    proc = start_runner(logs, "hermes-runner", **agents_env)
    runners.append(proc)
    return proc


@pytest.fixture
def session(db: None, settings: Any, hermes_agent_config: AgentConfig) -> Any:
    # The web side validates agent names against its own registry.
    from runs.agents import load_agents

    environ = {"HERMESWEB_AGENTS": json.dumps({"hermes": hermes_agent_config})}
    configured = load_agents(settings.DATA_DIR, environ)
    settings.HERMESWEB_AGENTS = {**settings.HERMESWEB_AGENTS, "hermes": configured["hermes"]}
    return factories.SessionFactory(project__agent="hermes")


def test_hermes_streams_an_answer_through_the_runner(
    runner: Proc, session: Any, scripted_llm: ScriptedLLM
) -> None:
    scripted_llm.enqueue(text("Hermes says hello from the scripted model.", chunks=5))
    run = run_of(submit(session, "Say hello"))
    wait_status(run, RunStatus.COMPLETED, timeout=60, log=runner.log)
    assert_journal_well_formed(run)
    final = state(run)
    assert "Hermes says hello from the scripted model." in final["text"]
    assert final["usage_final"] is not None


def test_hermes_second_turn_usage_is_its_own_not_the_sessions_running_total(
    runner: Proc, session: Any, scripted_llm: ScriptedLLM
) -> None:
    # Hermes reports the session's running total; the runner reads the previous turn's at the turn's end.
    scripted_llm.enqueue(text("The first answer.", chunks=2))
    first = run_of(submit(session, "First question"))
    wait_status(first, RunStatus.COMPLETED, timeout=60, log=runner.log)
    scripted_llm.enqueue(text("The second answer, somewhat longer than the first.", chunks=2))
    second = run_of(submit(session, "Second question"))
    wait_status(second, RunStatus.COMPLETED, timeout=60, log=runner.log)
    first.refresh_from_db()
    second.refresh_from_db()

    before, after = first.usage["session_total"], second.usage["session_total"]
    numeric = [k for k, v in after.items() if isinstance(v, int) and isinstance(before.get(k), int)]
    assert numeric and any(after[k] > before[k] for k in numeric)
    for key in numeric:
        assert second.usage[key] == after[key] - before[key], key


@pytest.mark.parametrize(("option", "deleted"), [("allow_once", True), ("deny", False)])
def test_a_dangerous_hermes_command_waits_for_approval_and_obeys_it(
    runner: Proc, session: Any, scripted_llm: ScriptedLLM, option: str, deleted: bool
) -> None:
    doomed = Path(session.project.path) / "doomed"
    doomed.mkdir()
    (doomed / "keep.txt").write_text("precious\n")
    scripted_llm.enqueue(tool_call("terminal", {"command": "rm -rf doomed"}), text("Done with the command."))
    run = run_of(submit(session, "Clean up the doomed directory"))
    wait_status(run, RunStatus.AWAITING_APPROVAL, timeout=60, log=runner.log)
    request = wait_event(run, "approval.requested")
    names = {o["option_id"]: o["name"] for o in request.payload["options"]}
    assert {"allow_once", "deny"} <= set(names)
    assert do_respond_approval(run, request.payload["approval_id"], option).status == "accepted"
    wait_status(run, RunStatus.COMPLETED, timeout=60, log=runner.log)
    assert_journal_well_formed(run)
    assert doomed.exists() is not deleted


def test_cancel_while_hermes_streams_ends_the_run_cancelled(
    runner: Proc, session: Any, scripted_llm: ScriptedLLM
) -> None:
    scripted_llm.enqueue(text("word " * 200, chunks=200, chunk_delay=0.05), text("After the cancel."))
    run = run_of(submit(session, "Talk for a while"))
    wait_event(run, "token.delta", timeout=60)
    assert do_cancel(run).status == "accepted"
    wait_status(run, RunStatus.CANCELLED, timeout=60, log=runner.log)
    assert_journal_well_formed(run)
    assert "word" in state(run)["text"]
    after = run_of(submit(session, "Are you still there?"))
    wait_status(after, RunStatus.COMPLETED, timeout=60, log=runner.log)
    assert "After the cancel." in state(after)["text"]


def test_steer_during_a_hermes_tool_loop_reaches_the_model(
    runner: Proc, session: Any, scripted_llm: ScriptedLLM
) -> None:
    steer = "STEER-91b: prefer tabs over spaces"
    release = Path(session.project.path) / "release"
    command = "while [ ! -e release ]; do sleep 0.05; done; echo released"
    scripted_llm.enqueue(tool_call("terminal", {"command": command}), text("Steered and done."))
    run = run_of(submit(session, "Format the code"))
    try:
        wait_event(run, "tool.started", timeout=60)
        result = submit(session, steer, mode="steer")
        assert result.kind == "steer"
        wait_event(run, "steer.delivered", timeout=60)
    finally:
        release.touch()  # never leave the shell loop running
    wait_status(run, RunStatus.COMPLETED, timeout=60, log=runner.log)
    requests = scripted_llm.wait_for_requests(2, scripted_only=True)
    assert steer in request_text(requests[1])
    assert "Steer queued" not in state(run)["text"]


def test_after_a_runner_restart_hermes_reloads_the_session_with_its_context(
    runners: list[Proc], logs: Path, agents_env: dict[str, str], session: Any, scripted_llm: ScriptedLLM
) -> None:
    codeword = "PAPAYA-5151"
    scripted_llm.enqueue(f"Noted, the codeword is {codeword}.", "You told me earlier.")
    first = start_runner(logs, "first", **agents_env)
    runners.append(first)
    one = run_of(submit(session, f"Remember the codeword {codeword}"))
    wait_status(one, RunStatus.COMPLETED, timeout=60, log=first.log)
    assert first.stop() == 0
    second = start_runner(logs, "second", **agents_env)
    runners.append(second)
    two = run_of(submit(session, "What was the codeword?"))
    wait_status(two, RunStatus.COMPLETED, timeout=60, log=second.log)
    follow_up = wait_for(
        lambda: scripted_llm.scripted_requests[-1] if len(scripted_llm.scripted_requests) >= 2 else None
    )
    assert f"Remember the codeword {codeword}" in request_text(follow_up)
    text_two = state(two)["text"]
    assert "You told me earlier." in text_two
    assert codeword not in text_two  # the load's replay was not journaled into the new turn
