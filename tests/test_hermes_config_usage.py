"""Config options, usage and the agents list with the real Hermes Agent (`hermes-acp`), offline.

The demo-agent side: tests/test_session_config_options.py, tests/test_usage_updates.py,
tests/test_api_agents.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from runs.models import RunStatus
from tests import factories
from tests.support.hermes import AgentConfig
from tests.support.procs import Proc, start_runner
from tests.support.runs import events, run_of, submit, wait_status
from tests.support.scripted_llm import ScriptedLLM, text

JSON = "application/json"
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.hermes]


@pytest.fixture
def runner(runners: list[Proc], logs: Path, hermes_agent_config: AgentConfig) -> Proc:
    spec = {**hermes_agent_config, "cumulative_usage": True, "steer": "slash"}
    proc = start_runner(logs, "hermes-runner", HERMESWEB_AGENTS=json.dumps({"hermes": spec}))
    runners.append(proc)
    return proc


@pytest.fixture
def session(user: Any, settings: Any, hermes_agent_config: AgentConfig) -> Any:
    from runs.agents import load_agents

    environ = {"HERMESWEB_AGENTS": json.dumps({"hermes": hermes_agent_config})}
    configured = load_agents(settings.DATA_DIR, environ)
    settings.HERMESWEB_AGENTS = {**settings.HERMESWEB_AGENTS, "hermes": configured["hermes"]}
    return factories.SessionFactory(project__agent="hermes", project__owner=user)


def turn(session: Any, runner: Proc, scripted_llm: ScriptedLLM, reply: str) -> Any:
    scripted_llm.enqueue(text(reply))
    return wait_status(
        run_of(submit(session, "Say something")), RunStatus.COMPLETED, timeout=90, log=runner.log
    )


def test_hermes_reports_modes_and_models_not_config_options(
    api: Client, runner: Proc, session: Any, scripted_llm: ScriptedLLM
) -> None:
    turn(session, runner, scripted_llm, "Hello from the scripted model.")
    body = api.get(f"/api/sessions/{session.pk}").json()
    # Hermes 0.19 speaks the older `modes`/`models` (tests/test_hermes_modes_models.py): no
    # config option pickers are drawn, and a config choice has nothing to name.
    assert body["modes"] and body["config_options"] == []
    refused = api.patch(f"/api/sessions/{session.pk}", {"config": {"mode": "dont_ask"}}, content_type=JSON)
    assert refused.status_code == 422 and refused.json()["code"] == "unknown_config_option"


def test_hermes_usage_updates_feed_the_meter_and_the_sessions_total(
    api: Client, runner: Proc, session: Any, scripted_llm: ScriptedLLM
) -> None:
    first = turn(session, runner, scripted_llm, "Hello from the scripted model.")
    second = turn(session, runner, scripted_llm, "And a second answer, a little longer than the first.")
    for run in (first, second):
        updates = [e.payload for e in events(run) if e.type == "usage.updated"]
        assert updates, "Hermes sends usage_update with each turn"
        assert updates[-1]["size"] > 0 and 0 < updates[-1]["used"] <= updates[-1]["size"]
        assert "cost" not in updates[-1]  # offline Hermes knows no price
    usage = api.get(f"/api/sessions/{session.pk}").json()["usage"]
    assert usage["runs"] == 2
    # Hermes reports a running total; each run keeps its own turn's (cumulative_usage), summed here.
    first.refresh_from_db()
    second.refresh_from_db()
    assert usage["tokens"]["totalTokens"] == first.usage["totalTokens"] + second.usage["totalTokens"] > 0
    assert usage["context"]["size"] == updates[-1]["size"]
    assert usage["cost"] is None


def test_the_agents_list_shows_what_hermes_reported_at_initialize(
    api: Client, runner: Proc, session: Any, scripted_llm: ScriptedLLM
) -> None:
    turn(session, runner, scripted_llm, "Hello from the scripted model.")
    hermes = next(a for a in api.get("/api/agents").json() if a["name"] == "hermes")
    assert hermes["can_start"] is True and hermes["label"] == "Hermes Agent"
    assert hermes["agent_info"]["name"] == "hermes-agent"
    assert hermes["capabilities"]["loadSession"] is True
    assert "fork" in hermes["capabilities"]["sessionCapabilities"]
