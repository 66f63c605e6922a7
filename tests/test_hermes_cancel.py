"""Stop with the real Hermes Agent (`hermes-acp`) while it reasons and while it runs a tool.

Each cancel must end the run `cancelled` with exactly one terminal event, and the session's
next turn must work. A cancel during a tool call jams the session inside that Hermes process
(/work/shared/docs/hermes-acp.md, "Bugs to survive"): the runner retires the process and the
next turn reloads the session (`session/load`) in a fresh one. The scripted model holds each
turn open (a slow stream, or a shell command waiting for a file) so the cancel lands mid-way;
the tests wait on journal events, not on time.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from runs.controls import do_cancel
from runs.models import RunStatus
from tests import factories
from tests.support import ptree
from tests.support.hermes import AgentConfig
from tests.support.procs import Proc, start_runner, wait_for
from tests.support.runs import (
    assert_journal_well_formed,
    events,
    run_of,
    state,
    submit,
    types,
    wait_event,
    wait_status,
)
from tests.support.scripted_llm import ScriptedLLM, reasoning, request_text, text, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.hermes]

# Hermes takes seconds to start, and many more on a busy machine: generous, as they are waits.
WAIT = 180
# The cancel deadline (HERMESWEB_CANCEL_GRACE_SECONDS, 10 s by default) of the runner that the
# test waiting it out uses: short, so it does not wait ten seconds.
CANCEL_GRACE_SECONDS = 3.0

STARTED = re.compile(r"agent hermes started for project \d+ \(pid (\d+)\)")


@pytest.fixture
def runner(runners: list[Proc], logs: Path, hermes_agent_config: AgentConfig) -> Proc:
    spec = {**hermes_agent_config, "cumulative_usage": True, "steer": "slash"}
    proc = start_runner(logs, "hermes-cancel", HERMESWEB_AGENTS=json.dumps({"hermes": spec}))
    runners.append(proc)
    return proc


@pytest.fixture
def short_deadline_runner(runners: list[Proc], logs: Path, hermes_agent_config: AgentConfig) -> Proc:
    """A runner whose cancel deadline is CANCEL_GRACE_SECONDS, for the test that waits it out
    (the others keep the default: a busy machine's Hermes may take seconds to end a turn)."""
    spec = {**hermes_agent_config, "cumulative_usage": True, "steer": "slash"}
    proc = start_runner(
        logs,
        "hermes-cancel",
        HERMESWEB_AGENTS=json.dumps({"hermes": spec}),
        HERMESWEB_CANCEL_GRACE_SECONDS=str(CANCEL_GRACE_SECONDS),
    )
    runners.append(proc)
    return proc


@pytest.fixture
def session(db: None, settings: Any, hermes_agent_config: AgentConfig) -> Any:
    from runs.agents import load_agents

    environ = {"HERMESWEB_AGENTS": json.dumps({"hermes": hermes_agent_config})}
    configured = load_agents(settings.DATA_DIR, environ)
    settings.HERMESWEB_AGENTS = {**settings.HERMESWEB_AGENTS, "hermes": configured["hermes"]}
    return factories.SessionFactory(project__agent="hermes")


def agent_pids(runner: Proc) -> list[str]:
    """The pids of the Hermes processes the runner started, in order (its log says each)."""
    return STARTED.findall(runner.log())


def nth_scripted_request(llm: ScriptedLLM, n: int) -> dict[str, Any]:
    return wait_for(
        lambda: llm.scripted_requests[n - 1] if len(llm.scripted_requests) >= n else None, timeout=WAIT
    )


def test_cancel_while_hermes_reasons_ends_the_turn_and_the_session_goes_on(
    runner: Proc, session: Any, scripted_llm: ScriptedLLM
) -> None:
    scripted_llm.enqueue(
        reasoning("pondering " * 400, "Never said.", chunks=400, chunk_delay=0.05),
        text("Back after the stop."),
    )
    run = run_of(submit(session, "Think hard about caching"))
    wait_event(run, "reasoning.delta", timeout=WAIT)
    assert do_cancel(run).status == "accepted"

    wait_status(run, RunStatus.CANCELLED, timeout=WAIT, log=runner.log)
    assert_journal_well_formed(run)
    final = state(run)
    assert final["terminal_state"] == "cancelled"
    assert "Never said." not in final["text"]
    assert "reasoning.done" in types(run)  # the open reasoning block was closed
    after = run_of(submit(session, "Still there?"))
    wait_status(after, RunStatus.COMPLETED, timeout=WAIT, log=runner.log)
    assert "Back after the stop." in state(after)["text"]
    # Cancelled while the model streamed, Hermes' session stays usable in the same process.
    assert len(agent_pids(runner)) == 1


def test_cancel_while_hermes_runs_a_tool_recovers_on_a_fresh_process(
    runner: Proc, session: Any, scripted_llm: ScriptedLLM
) -> None:
    release = Path(session.project.path) / "release"
    command = "while [ ! -e release ]; do sleep 0.05; done; echo released"
    scripted_llm.enqueue(tool_call("terminal", {"command": command}))
    run = run_of(submit(session, "Wait for the release file"))
    try:
        wait_event(run, "tool.started", timeout=WAIT)
        assert do_cancel(run).status == "accepted"
        wait_status(run, RunStatus.CANCELLED, timeout=WAIT, log=runner.log)
    finally:
        release.touch()  # never leave the shell loop running
    assert_journal_well_formed(run)
    final = state(run)
    assert final["terminal_state"] == "cancelled"
    assert all(tool.get("done") for tool in final["tools"].values())

    scripted_llm.enqueue(text("Back after the jam."))  # the next turn's, whatever the cancelled one asked
    after = run_of(submit(session, "Are you unstuck?"))
    wait_status(after, RunStatus.COMPLETED, timeout=WAIT, log=runner.log)
    assert_journal_well_formed(after)
    assert "Back after the jam." in state(after)["text"]
    # A second Hermes process took the session over with session/load: the model sees the
    # cancelled turn's prompt in the history it was sent.
    first, second = wait_for(lambda: agent_pids(runner) if len(agent_pids(runner)) == 2 else None)
    assert first != second
    assert "Wait for the release file" in request_text(nth_scripted_request(scripted_llm, 2))


def test_cancel_while_hermes_waits_for_an_approval_recovers_on_a_fresh_process(
    runner: Proc, session: Any, scripted_llm: ScriptedLLM
) -> None:
    doomed = Path(session.project.path) / "doomed"
    doomed.mkdir()
    scripted_llm.enqueue(tool_call("terminal", {"command": "rm -rf doomed"}))
    run = run_of(submit(session, "Clean up the doomed directory"))
    wait_status(run, RunStatus.AWAITING_APPROVAL, timeout=WAIT, log=runner.log)
    assert do_cancel(run).status == "accepted"

    wait_status(run, RunStatus.CANCELLED, timeout=WAIT, log=runner.log)
    assert_journal_well_formed(run)
    assert doomed.exists()  # a cancel is never a grant
    assert state(run)["terminal_state"] == "cancelled"
    # The jammed process's refused tool call may still reach the model at any time (the default
    # answer takes that): the next turn's answer goes to the request that holds its prompt.
    scripted_llm.reply_to("Never mind, carry on", text("Back after the refusal."))
    after = run_of(submit(session, "Never mind, carry on"))
    wait_status(after, RunStatus.COMPLETED, timeout=WAIT, log=runner.log)
    assert "Back after the refusal." in state(after)["text"]
    assert doomed.exists()


def test_a_hermes_that_stops_answering_after_a_cancel_is_ended_by_the_deadline(
    short_deadline_runner: Proc, session: Any, scripted_llm: ScriptedLLM
) -> None:
    """The jam at its worst: the agent never answers the cancelled prompt (frozen with SIGSTOP
    while its tool runs). The runner ends the turn `cancelled` at its cancel deadline, retires
    the process, and the next turn reloads the session in a fresh one."""
    runner = short_deadline_runner
    release = Path(session.project.path) / "release"
    command = "while [ ! -e release ]; do sleep 0.05; done; echo released"
    scripted_llm.enqueue(tool_call("terminal", {"command": command}), text("Back after the freeze."))
    run = run_of(submit(session, "Wait for the release file"))
    frozen: list[int] = []
    try:
        wait_event(run, "tool.started", timeout=WAIT)
        frozen = [pid for pid in ptree.descendants(runner.pid) if is_hermes(pid)]
        assert frozen, "no hermes-acp process under the runner"
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        cancelled_at = time.monotonic()
        assert do_cancel(run).status == "accepted"
        wait_status(run, RunStatus.CANCELLED, timeout=CANCEL_GRACE_SECONDS + 60, log=runner.log)
        took = time.monotonic() - cancelled_at
    finally:
        release.touch()
        for pid in frozen:  # the runner kills it; never leave one stopped if it did not
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert CANCEL_GRACE_SECONDS <= took < CANCEL_GRACE_SECONDS + 60  # the deadline, not a hang
    assert_journal_well_formed(run)
    done = events(run)[-1].payload
    assert (done["state"], done["reason"]) == (
        "cancelled",
        "the agent did not acknowledge the cancel in time",
    )

    after = run_of(submit(session, "Are you back?"))
    wait_status(after, RunStatus.COMPLETED, timeout=WAIT, log=runner.log)
    assert "Back after the freeze." in state(after)["text"]
    # Retired, not reused: its close (the SDK's shutdown, at most 10 s, then a kill) runs beside
    # the next turn, which on a busy machine may finish first.
    wait_for(lambda: not any(ptree.alive(pid) for pid in frozen), timeout=20, what="the frozen hermes to end")
    assert len(agent_pids(runner)) == 2
    assert "Wait for the release file" in request_text(nth_scripted_request(scripted_llm, 2))


def is_hermes(pid: int) -> bool:
    return any(part.endswith("hermes-acp") for part in ptree.cmdline(pid))
