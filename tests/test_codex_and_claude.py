"""Codex and Claude through the runner, offline: the same script words as Hermes' tests.

Both run as the built-in entries do (runs/agent_homes.py: a per-user CODEX_HOME or
CLAUDE_CONFIG_DIR seeded from the operator's), in our sandbox, with the scripted model server
(tests/support/scripted_llm.py: the Responses API for Codex, the Messages API for Claude) as
their only network. Every test ends by proving that no other connection left: the runner's
proxy refused nothing (a refusal is counted on the run and logged as "network: refused").
The agents come from bin/setup-agents (tests/support/npm_agents.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runs.controls import do_cancel, do_respond_approval
from runs.models import Run, RunStatus
from tests import factories
from tests.support.npm_agents import agents_bin, entry_for, shell_call
from tests.support.procs import Proc, start_runner, wait_for
from tests.support.runs import (
    assert_journal_well_formed,
    events,
    run_of,
    state,
    submit,
    wait_event,
    wait_status,
)
from tests.support.scripted_llm import ScriptedLLM, reasoning, request_text, text, tool_call
from tests.test_sandbox import needs_bwrap

# `hermes`: the real-agent tests, run once (bin/test's SQLite pass), not again on PostgreSQL.
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.hermes,
    needs_bwrap,
    pytest.mark.timeout(240),
]

AGENTS = ["codex", "claude"]
TURN = 150.0  # a cold first turn on a busy 2-core box: Claude ~5 s alone, Codex ~2 s


@pytest.fixture(scope="session")
def bin_dir() -> Path:
    return agents_bin()


@pytest.fixture(params=AGENTS)
def agent(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def entry(agent: str, tmp_path: Path, scripted_llm: ScriptedLLM, bin_dir: Path) -> dict[str, Any]:
    return entry_for(agent, tmp_path, scripted_llm, bin_dir)


@pytest.fixture
def runner(runners: list[Proc], logs: Path, agent: str, entry: dict[str, Any]) -> Proc:
    proc = start_runner(logs, f"{agent}-runner", HERMESWEB_AGENTS=json.dumps({agent: entry}))
    runners.append(proc)
    return proc


@pytest.fixture
def session(db: None, settings: Any, agent: str, entry: dict[str, Any]) -> Any:
    # The web side validates agent names against its own registry.
    from runs.agents import load_agents

    configured = load_agents(settings.DATA_DIR, {"HERMESWEB_AGENTS": json.dumps({agent: entry})})
    settings.HERMESWEB_AGENTS = {**settings.HERMESWEB_AGENTS, agent: configured[agent]}
    return factories.SessionFactory(project__agent=agent)


def assert_nothing_else_left(run: Run, runner: Proc) -> None:
    """The proxy lets the agent reach the scripted server only: no refusal means no other try."""
    run.refresh_from_db()
    assert run.network_refused == 0, run.network_refused
    refusals = [line for line in runner.log().splitlines() if "network: refused" in line]
    assert not refusals, refusals


def agent_text(run: Run) -> str:
    return state(run)["text"]


def test_text_and_reasoning_stream_from_the_scripted_model(
    agent: str, runner: Proc, session: Any, scripted_llm: ScriptedLLM
) -> None:
    scripted_llm.enqueue(reasoning("Weighing the greeting.", "Hello from the scripted model.", chunks=4))
    run = run_of(submit(session, "Say hello"))
    wait_status(run, RunStatus.COMPLETED, timeout=TURN, log=runner.log)
    assert_journal_well_formed(run)
    assert "Hello from the scripted model." in agent_text(run)
    thought = "".join(e.payload.get("delta", "") for e in events(run) if e.type == "reasoning.delta")
    assert thought == "Weighing the greeting."
    assert state(run)["usage_final"] is not None
    first = scripted_llm.scripted_requests[0]
    assert "Say hello" in request_text(first)
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert_nothing_else_left(run, runner)


def test_a_shell_tool_runs_in_the_sandbox_and_its_output_reaches_the_model(
    agent: str, runner: Proc, session: Any, scripted_llm: ScriptedLLM
) -> None:
    marker = "TOOL-OUT-7f3"
    name, arguments = shell_call(agent, f"echo {marker} && id -un")
    scripted_llm.enqueue(tool_call(name, arguments), text("The command ran."))
    run = run_of(submit(session, "Run the command"))
    wait_status(run, RunStatus.COMPLETED, timeout=TURN, log=runner.log)
    assert_journal_well_formed(run)
    started = wait_event(run, "tool.started")
    assert started.payload["tool_kind"] == "execute"
    done = [e for e in events(run) if e.type == "tool.done"]
    assert done and done[0].payload["status"] == "completed", [e.payload for e in done]
    second = scripted_llm.wait_for_requests(2, scripted_only=True)[1]
    said = request_text(second)
    assert marker in said
    assert "hermesweb-agent" in said or "root" not in said.split(marker, 1)[1][:40]  # never root
    assert "The command ran." in agent_text(run)
    assert_nothing_else_left(run, runner)


def test_a_permission_shows_the_agents_own_options_and_obeys_the_user(
    agent: str, runner: Proc, session: Any, scripted_llm: ScriptedLLM
) -> None:
    doomed = Path(session.project.path) / "doomed"
    doomed.mkdir()
    (doomed / "keep.txt").write_text("precious\n")
    name, arguments = shell_call(agent, "rm -rf doomed", escalate=True)
    scripted_llm.enqueue(tool_call(name, arguments), text("Done with the command."))
    run = run_of(submit(session, "Clean up the doomed directory"))
    wait_status(run, RunStatus.AWAITING_APPROVAL, timeout=TURN, log=runner.log)
    request = wait_event(run, "approval.requested")
    options = {o["option_id"]: (o["kind"], o["name"]) for o in request.payload["options"]}
    assert doomed.exists()  # nothing ran before the answer
    allow = expected_options(agent, options)
    assert do_respond_approval(run, request.payload["approval_id"], allow).status == "accepted"
    wait_status(run, RunStatus.COMPLETED, timeout=TURN, log=runner.log)
    assert_journal_well_formed(run)
    assert not doomed.exists()
    assert_nothing_else_left(run, runner)


def expected_options(agent: str, options: dict[str, tuple[str, str]]) -> str:
    """The agent's own option ids, kinds and labels as recorded (tests/fixtures/npm_agents/)."""
    if agent == "codex":
        assert options == {
            "allow_once": ("allow_once", "Yes, proceed"),
            "accept_execpolicy_amendment": (
                "allow_always",
                "Yes, and don't ask again for commands that start with `rm -rf doomed`",
            ),
            "cancel": ("reject_once", "No, and tell Codex what to do differently"),
        }
        # Codex writes the amendment to its rules in CODEX_HOME: the user's own, writable.
        return "accept_execpolicy_amendment"
    assert options == {"allow-once": ("allow_once", "Yes"), "reject": ("reject_once", "No")}
    return "allow-once"


def test_cancel_mid_text_ends_the_run_cancelled_and_the_session_goes_on(
    agent: str, runner: Proc, session: Any, scripted_llm: ScriptedLLM
) -> None:
    import threading

    gate = threading.Event()
    scripted_llm.enqueue(text("word " * 50, chunks=50, gate=gate), text("After the cancel."))
    run = run_of(submit(session, "Talk for a while"))
    try:
        wait_for(lambda: "word" in agent_text(run), TURN, what="the gated answer's first words")
        assert do_cancel(run).status == "accepted"
        wait_status(run, RunStatus.CANCELLED, timeout=TURN, log=runner.log)
    finally:
        gate.set()
    assert_journal_well_formed(run)
    assert "word" in agent_text(run)
    assert agent_text(run).count("word") < 50
    after = run_of(submit(session, "Are you still there?"))
    wait_status(after, RunStatus.COMPLETED, timeout=TURN, log=runner.log)
    assert "After the cancel." in agent_text(after)
    assert_nothing_else_left(after, runner)


@pytest.mark.parametrize("agent", ["claude"])
def test_claudes_allow_with_updates_is_offered_and_the_rule_kept_for_the_next_turn(
    agent: str, runner: Proc, session: Any, scripted_llm: ScriptedLLM
) -> None:
    # Claude offers "don't ask again" for commands it can write a rule for (not for `rm -rf`).
    name, arguments = shell_call(agent, "make lint")  # npm would try its registry
    scripted_llm.enqueue(
        tool_call(name, arguments), text("Linted."), tool_call(name, arguments), text("Again.")
    )
    run = run_of(submit(session, "Lint the project"))
    wait_status(run, RunStatus.AWAITING_APPROVAL, timeout=TURN, log=runner.log)
    request = wait_event(run, "approval.requested")
    options = {o["option_id"]: (o["kind"], o["name"]) for o in request.payload["options"]}
    assert options["allow-with-updates"] == (
        "allow_always",
        "Yes, and don't ask again for make lint * commands",
    )
    assert do_respond_approval(run, request.payload["approval_id"], "allow-with-updates").status == "accepted"
    wait_status(run, RunStatus.COMPLETED, timeout=TURN, log=runner.log)
    # The rule lives in the user's own, writable config: the next `make lint` is not asked about.
    again = run_of(submit(session, "Lint it again"))
    wait_status(again, RunStatus.COMPLETED, timeout=TURN, log=runner.log)
    assert not [e for e in events(again) if e.type == "approval.requested"]
    assert "Again." in agent_text(again)
    assert_nothing_else_left(again, runner)


def test_a_steer_reaches_the_agent_mid_turn_by_its_steering_extension(
    agent: str, runner: Proc, session: Any, scripted_llm: ScriptedLLM
) -> None:
    # Both advertise `_meta.steering.supported`: detected as `_session/steering` (runs/agents.py).
    import threading

    steer = "STEER-5c2: answer in French"
    gate = threading.Event()
    scripted_llm.enqueue(text("word " * 50, chunks=50, gate=gate), text("Steered and done."))
    run = run_of(submit(session, "Talk for a while"))
    try:
        wait_for(lambda: "word" in agent_text(run), TURN, what="the gated answer's first words")
        result = submit(session, steer, mode="steer")
        assert result.kind == "steer", result
        delivered = wait_event(run, "steer.delivered", timeout=TURN)
    finally:
        gate.set()
    assert delivered.payload["state"] == "delivered", delivered.payload
    wait_status(run, RunStatus.COMPLETED, timeout=TURN, log=runner.log)
    assert_journal_well_formed(run)
    # The steer went into the same turn: a later model request of this run carries it.
    wait_for(
        lambda: any(steer in request_text(r) for r in scripted_llm.scripted_requests[1:]),
        TURN,
        what="a model request with the steer",
    )
    assert "Steered and done." in agent_text(run)
    assert Run.objects.filter(session=session).count() == 1  # no queued turn: it was a steer
    assert_nothing_else_left(run, runner)
