"""What an agent sends after its turn has ended (Hermes: the title, commands) still reaches the session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from projects.models import Session
from runs.models import RunStatus
from runs.runner.translate import Translator
from tests import factories
from tests.support.hermes import AgentConfig
from tests.support.procs import Proc, start_runner, wait_for
from tests.support.runs import run_of, state, submit, wait_status
from tests.support.scripted_llm import SIDE_CALL_TEXT, ScriptedLLM, text


def test_a_tool_left_open_by_a_cancelled_turn_closes_as_failed_not_completed() -> None:
    translator = Translator()
    translator.translate({"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "sleep 60"})

    (done,) = translator.finish("cancelled")

    assert done.payload["status"] == "failed" and done.payload["error"] is True
    assert done.payload["closed_by"] == "cancelled"


def test_a_tool_left_open_at_a_normal_turn_end_is_done() -> None:
    translator = Translator()
    translator.translate({"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "write_file"})

    (done,) = translator.finish()

    assert (done.payload["status"], done.payload["closed_by"]) == ("completed", "turn_end")


@pytest.mark.hermes
@pytest.mark.django_db(transaction=True)
def test_hermes_titles_the_session_after_its_first_turn(
    runners: list[Proc],
    logs: Path,
    settings: Any,
    hermes_agent_config: AgentConfig,
    scripted_llm: ScriptedLLM,
) -> None:
    import json

    from runs.agents import load_agents

    agents = json.dumps({"hermes": dict(hermes_agent_config)})
    settings.HERMESWEB_AGENTS = load_agents(Path(settings.DATA_DIR), {"HERMESWEB_AGENTS": agents})
    runner = start_runner(logs, "hermes-title", HERMESWEB_AGENTS=agents)
    runners.append(runner)
    session = factories.SessionFactory(project__agent="hermes", title="")
    scripted_llm.enqueue(text("Hello there.", chunks=3))

    run = run_of(submit(session, "Say hello"))
    wait_status(run, RunStatus.COMPLETED, timeout=60, log=runner.log)

    # Hermes sends session_info_update ~0.2 s after the prompt's answer, when no run listens.
    title = wait_for(lambda: Session.objects.get(pk=session.pk).title or None, timeout=30)
    assert title == SIDE_CALL_TEXT
    assert state(run)["text"] == "Hello there."
