"""Steer for an agent the operator left at `steer = "auto"`: detected from what the agent says."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from intents.services import steer_support
from runs.agents import detected_steer
from runs.models import RunStatus
from tests import factories
from tests.support.hermes import AgentConfig
from tests.support.procs import Proc, start_runner
from tests.support.runs import run_of, submit, wait_event, wait_status
from tests.support.scripted_llm import ScriptedLLM, request_text, text, tool_call


def test_hermes_by_name_takes_slash_steer() -> None:
    assert detected_steer("hermes-agent", {}) == "slash"


def test_a_steer_command_among_the_sessions_commands_means_slash_steer() -> None:
    assert detected_steer("some-agent", {}, ["help", "steer", "model"]) == "slash"


def test_initialize_meta_still_decides_for_agents_that_declare_it() -> None:
    assert detected_steer("x", {"steer": "slash"}) == "slash"
    assert detected_steer("x", {"_session/steering": {}}) == "extension"


def test_the_steering_extensions_supported_flag_means_extension_steer() -> None:
    # codex-acp and claude-agent-acp say it this way (tests/fixtures/npm_agents/*_text.jsonl).
    assert detected_steer("codex-acp", {"steering": {"supported": True}}) == "extension"
    assert detected_steer("claude-agent-acp", {"steering": {"supported": False}}) == "none"


def test_an_agent_that_says_nothing_takes_no_steer() -> None:
    assert detected_steer("x", {}, ["help"]) == "none"


@pytest.mark.django_db
def test_the_web_offers_steer_once_the_session_advertised_the_command(settings: Any) -> None:
    session = factories.SessionFactory(project__agent="demo")
    settings.HERMESWEB_AGENTS = {
        **settings.HERMESWEB_AGENTS,
        "demo": type(settings.HERMESWEB_AGENTS["demo"])(name="demo", command="demo", steer="auto"),
    }
    assert steer_support(session)[0] is False
    session.commands = [{"name": "steer", "description": "guide the active turn", "input_hint": None}]
    assert steer_support(session) == (True, "")


@pytest.mark.hermes
@pytest.mark.django_db(transaction=True)
def test_hermes_configured_without_a_steer_key_is_steered_not_queued(
    runners: list[Proc],
    logs: Path,
    settings: Any,
    hermes_agent_config: AgentConfig,
    scripted_llm: ScriptedLLM,
) -> None:
    from runs.agents import _spec

    spec = dict(hermes_agent_config)  # no "steer" key: the operator left it to detection
    settings.HERMESWEB_AGENTS = {**settings.HERMESWEB_AGENTS, "hermes": _spec("hermes", spec, "test")}
    assert settings.HERMESWEB_AGENTS["hermes"].steer == "auto"
    runner = start_runner(logs, "hermes-auto-steer", HERMESWEB_AGENTS=json.dumps({"hermes": spec}))
    runners.append(runner)
    session = factories.SessionFactory(project__agent="hermes")

    steer = "STEER-auto-7c: prefer tabs"
    release = Path(session.project.path) / "release"
    command = "while [ ! -e release ]; do sleep 0.05; done; echo released"
    scripted_llm.enqueue(tool_call("terminal", {"command": command}), text("Steered and done."))
    run = run_of(submit(session, "Format the code"))
    try:
        wait_event(run, "tool.started", timeout=60)
        result = submit(session, steer, mode="steer")
        assert result.kind == "steer", result
        wait_event(run, "steer.delivered", timeout=60)
    finally:
        release.touch()  # never leave the shell loop running
    wait_status(run, RunStatus.COMPLETED, timeout=60, log=runner.log)
    requests = scripted_llm.wait_for_requests(2, scripted_only=True)
    assert steer in request_text(requests[1])
