"""Fork with the real Hermes Agent (`hermes-acp`): the fork's first turn carries the parent's context.

Hermes runs against the scripted OpenAI-compatible server (tests/support/scripted_llm.py); what
reaches that server is what the model was asked, so the parent's conversation in the fork's
first request proves `session/fork` happened (not a fresh `session/new`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runs.fork import do_fork_session
from runs.models import RunStatus
from tests import factories
from tests.support.hermes import AgentConfig
from tests.support.procs import Proc, start_runner, wait_for
from tests.support.runs import assert_journal_well_formed, run_of, state, submit, wait_status
from tests.support.scripted_llm import ScriptedLLM, request_text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.hermes]

# Hermes takes seconds to start, and many more on a busy machine: generous, as they are waits.
WAIT = 180


@pytest.fixture
def runner(runners: list[Proc], logs: Path, hermes_agent_config: AgentConfig) -> Proc:
    spec = {**hermes_agent_config, "cumulative_usage": True, "steer": "slash"}
    proc = start_runner(logs, "hermes-fork", HERMESWEB_AGENTS=json.dumps({"hermes": spec}))
    runners.append(proc)
    return proc


@pytest.fixture
def session(db: None, settings: Any, hermes_agent_config: AgentConfig) -> Any:
    from runs.agents import load_agents

    environ = {"HERMESWEB_AGENTS": json.dumps({"hermes": hermes_agent_config})}
    configured = load_agents(settings.DATA_DIR, environ)
    settings.HERMESWEB_AGENTS = {**settings.HERMESWEB_AGENTS, "hermes": configured["hermes"]}
    return factories.SessionFactory(project__agent="hermes")


def nth_scripted_request(llm: ScriptedLLM, n: int) -> dict[str, Any]:
    return wait_for(
        lambda: llm.scripted_requests[n - 1] if len(llm.scripted_requests) >= n else None, timeout=WAIT
    )


def test_the_forks_first_turn_sends_the_parents_conversation_to_the_model(
    runner: Proc, session: Any, scripted_llm: ScriptedLLM
) -> None:
    codeword = "KIWI-7781"
    scripted_llm.enqueue(f"Noted: {codeword}.", "It was the kiwi one.", "The parent goes on.")
    first = run_of(submit(session, f"Remember the codeword {codeword}"))
    wait_status(first, RunStatus.COMPLETED, timeout=WAIT, log=runner.log)
    session.refresh_from_db()

    fork = do_fork_session(session.project.owner, session.pk)
    turn = run_of(submit(fork, "What was the codeword?"))
    wait_status(turn, RunStatus.COMPLETED, timeout=WAIT, log=runner.log)

    assert_journal_well_formed(turn)
    asked = request_text(nth_scripted_request(scripted_llm, 2))
    assert f"Remember the codeword {codeword}" in asked
    assert f"Noted: {codeword}." in asked
    assert "What was the codeword?" in asked
    assert "It was the kiwi one." in state(turn)["text"]
    fork.refresh_from_db()
    assert fork.agent_session_id and fork.agent_session_id != session.agent_session_id
    assert fork.fork_agent_session_id == ""
    # The parent's agent session is its own: the fork's question never reaches it.
    after = run_of(submit(session, "Carry on"))
    wait_status(after, RunStatus.COMPLETED, timeout=WAIT, log=runner.log)
    parent_asked = request_text(nth_scripted_request(scripted_llm, 3))
    assert f"Remember the codeword {codeword}" in parent_asked
    assert "What was the codeword?" not in parent_asked
