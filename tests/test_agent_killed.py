"""The agent process is killed (SIGKILL) while its turn streams: the demo agent and real Hermes.

The run ends `failed` with `error{code: agent_died}` and exactly one terminal event; the
session's next turn runs in a fresh agent process that reopens the agent session with
`session/load` (same agent session id, its history intact). The agent's pid is found in the
process tree of the runner this test started (tests/support/ptree.py) and killed by pid alone.
Issue 23; docs/reliability.md.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from runs.agents import agent_state_dir
from runs.models import RunStatus
from tests import factories
from tests.support import ptree
from tests.support.hermes import AgentConfig
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
from tests.support.scripted_llm import ScriptedLLM, request_text, text

pytestmark = pytest.mark.django_db(transaction=True)


def the_agent(runner: Proc, marker: str) -> int:
    pids = wait_for(lambda: ptree.agent_pids(runner.pid, marker), 30, what=f"the runner's {marker} process")
    assert len(pids) == 1, f"one agent process per (project, agent), got {pids}"
    return int(pids[0])


def kill_and_time(pid: int, runner: Proc, run: Any) -> float:
    """SIGKILL the agent; seconds until the run is failed in the database."""
    started = time.monotonic()
    ptree.kill9(pid, runner.pid)
    wait_status(run, RunStatus.FAILED, timeout=30, log=runner.log)
    return time.monotonic() - started


def assert_failed_once_as_agent_died(run: Any) -> dict[str, Any]:
    assert_journal_well_formed(run)  # seq 1..N, exactly one terminal event, the last
    seen = types(run)
    assert seen.count("run.started") == 1 and seen.count("done") == 1
    error = [e for e in events(run) if e.type == "error"]
    assert len(error) == 1, seen
    assert error[0].payload["code"] == "agent_died"
    assert "died during the turn" in error[0].payload["message"]
    done = events(run)[-1].payload
    assert done["state"] == "failed" and done["code"] == "agent_died", done
    assert "died during the turn" in done["reason"]
    assert "died during the turn" in refreshed(run).error
    return done


@pytest.mark.timeout(120)
def test_a_killed_demo_agent_fails_its_turn_once_and_the_next_turn_reloads_the_session(
    runners: list[Proc], logs: Path, db: None
) -> None:
    runner = start_runner(logs, "kills-demo", HERMESWEB_DEMO_DELAY="0.05")
    runners.append(runner)
    session = factories.SessionFactory(project__agent="demo")
    first = run_of(submit(session, "remember the word papaya, fast"))
    wait_status(first, RunStatus.COMPLETED, log=runner.log)
    agent_session = refreshed(first).session.agent_session_id
    assert agent_session

    streaming = run_of(submit(session, "hold"))  # open until the kill
    wait_event(streaming, "token.delta")
    doomed = the_agent(runner, "runs.demo_agent")
    took = kill_and_time(doomed, runner, streaming)
    assert_failed_once_as_agent_died(streaming)
    assert "Held chunk" in state(streaming)["text"]  # what streamed before the kill is kept
    assert not ptree.alive(doomed)

    after = run_of(submit(session, "are you back? fast"))
    wait_status(after, RunStatus.COMPLETED, log=runner.log)
    assert_journal_well_formed(after)
    assert "are you back?" in state(after)["text"]
    fresh = the_agent(runner, "runs.demo_agent")
    assert fresh != doomed
    session.refresh_from_db()
    # Reopened, not replaced: the fresh process took the same agent session (session/load; the
    # demo agent refuses a prompt for a session it neither created nor loaded), and that session
    # holds every turn's prompt, the killed one's too.
    assert session.agent_session_id == agent_session
    # The demo agent keeps the owner's sessions under $HOME, the owner's state directory.
    home = agent_state_dir(settings.DATA_DIR, session.project.owner_id, "demo")
    stored = home / ".hermesweb-demo-agent" / "sessions" / f"{agent_session}.json"
    prompts = stored.read_text()
    assert "papaya" in prompts and "hold" in prompts and "are you back?" in prompts
    assert "papaya" not in state(after)["text"]  # the load's history replay is not journaled again
    print(f"FIGURE agent_killed demo: SIGKILL -> run failed in {took:.2f} s")


@pytest.fixture
def hermes_session(db: None, settings: Any, hermes_agent_config: AgentConfig) -> Any:
    from runs.agents import _spec

    settings.HERMESWEB_AGENTS = {
        **settings.HERMESWEB_AGENTS,
        "hermes": _spec("hermes", dict(hermes_agent_config), "test"),
    }
    return factories.SessionFactory(project__agent="hermes")


@pytest.mark.hermes
@pytest.mark.timeout(180)  # Hermes starts in ~1.5 s, twice here, slower on a busy box
def test_a_killed_hermes_fails_its_turn_once_and_the_next_turn_reloads_the_session(
    runners: list[Proc],
    logs: Path,
    hermes_session: Any,
    hermes_agent_config: AgentConfig,
    scripted_llm: ScriptedLLM,
) -> None:
    spec = {**hermes_agent_config, "cumulative_usage": True, "steer": "slash"}
    runner = start_runner(logs, "kills-hermes", HERMESWEB_AGENTS=json.dumps({"hermes": spec}))
    runners.append(runner)
    session = hermes_session
    held = threading.Event()
    scripted_llm.enqueue(
        text("The word is papaya.", chunks=2),
        text("This answer never finishes: the agent is killed mid-stream.", chunks=6, gate=held),
        text("Back after the kill.", chunks=2),
    )
    try:
        first = run_of(submit(session, "Remember the word papaya"))
        wait_status(first, RunStatus.COMPLETED, timeout=60, log=runner.log)
        agent_session = refreshed(first).session.agent_session_id
        assert agent_session

        streaming = run_of(submit(session, "Tell me a long story"))
        wait_event(streaming, "token.delta", timeout=60)  # the first chunk; the rest waits on `held`
        doomed = the_agent(runner, "hermes-acp")
        took = kill_and_time(doomed, runner, streaming)
    finally:
        held.set()  # never leave the scripted stream waiting
    assert_failed_once_as_agent_died(streaming)
    assert state(streaming)["text"].startswith("This")  # the chunk streamed before the kill is kept

    after = run_of(submit(session, "Which word did I ask you to remember?"))
    wait_status(after, RunStatus.COMPLETED, timeout=60, log=runner.log)
    assert_journal_well_formed(after)
    assert "Back after the kill." in state(after)["text"]
    assert the_agent(runner, "hermes-acp") != doomed
    session.refresh_from_db()
    assert session.agent_session_id == agent_session  # session/load, not session/new
    # The fresh process loaded the session's history: the model sees the first turn again.
    requests = scripted_llm.wait_for_requests(3, scripted_only=True)
    assert "Remember the word papaya" in request_text(requests[-1])
    print(f"FIGURE agent_killed hermes: SIGKILL -> run failed in {took:.2f} s")


def test_the_demo_agent_takes_the_next_turn_of_a_session_killed_while_awaiting_approval() -> None:
    """Found by the scale-out test: an `approve` turn whose runner (or agent) was killed while
    the permission was pending leaves the tool call last in the saved history; the session's next
    turn, in a fresh agent process after session/load, must still run."""
    from runs.demo_agent.store import StoredSession, now_iso

    stored = StoredSession("s1", "/tmp", now_iso(), now_iso())
    stored.append({"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "approve"}})
    stored.append(
        {
            "sessionUpdate": "tool_call",
            "toolCallId": "call-1",
            "title": "Write approved.txt",
            "kind": "edit",
            "status": "pending",
            "content": [{"type": "diff", "path": "/tmp/approved.txt", "oldText": None, "newText": "ok\n"}],
        }
    )
    # The next turn's prompt, as record_user_prompt appends it.
    stored.append({"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "next"}})
    assert stored.history[-1]["content"]["text"] == "next"
