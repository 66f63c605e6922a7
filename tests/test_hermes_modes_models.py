"""Modes and models with the real Hermes Agent (`hermes-acp`), offline, through the API and the runner.

Hermes reports three modes (`default`, `accept_edits`, `dont_ask`) and lists only its
current model (`custom:mock-model`), yet switches to any model name with `session/set_model`
(SDK 0.12 has no such method: the runner sends it raw). The demo-agent side of the same
feature: tests/test_session_modes_models.py.
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
from tests.support.runs import events, run_of, state, submit, types, wait_status
from tests.support.scripted_llm import ScriptedLLM, text, tool_call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.hermes]

JSON = "application/json"


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


def first_turn(session: Any, runner: Proc, scripted_llm: ScriptedLLM) -> None:
    scripted_llm.enqueue(text("Hello from the scripted model."))
    wait_status(run_of(submit(session, "Say hello")), RunStatus.COMPLETED, timeout=90, log=runner.log)
    session.refresh_from_db()


def started(run: Any) -> dict[str, Any]:
    return next(e.payload for e in events(run) if e.type == "run.started")


def test_hermes_reports_its_modes_and_its_model(
    api: Client, runner: Proc, session: Any, scripted_llm: ScriptedLLM
) -> None:
    first_turn(session, runner, scripted_llm)
    body = api.get(f"/api/sessions/{session.pk}").json()
    assert [m["id"] for m in body["modes"]] == ["default", "accept_edits", "dont_ask"]
    assert all(m["name"] and "description" in m for m in body["modes"])
    assert body["models"] == [{"id": "custom:mock-model", "name": "mock-model"}]
    assert (body["mode"], body["model"]) == ("default", "custom:mock-model")


def test_in_accept_edits_a_hermes_edit_runs_without_asking(
    api: Client, runner: Proc, session: Any, scripted_llm: ScriptedLLM
) -> None:
    first_turn(session, runner, scripted_llm)
    response = api.patch(f"/api/sessions/{session.pk}", {"mode": "accept_edits"}, content_type=JSON)
    assert response.status_code == 200, response.content

    target = Path(session.project.path) / "notes.txt"
    scripted_llm.enqueue(
        tool_call("write_file", {"path": str(target), "content": "written without asking\n"}),
        text("Wrote the notes."),
    )
    run = wait_status(
        run_of(submit(session, "Write the notes")), RunStatus.COMPLETED, timeout=90, log=runner.log
    )
    assert "approval.requested" not in types(run)
    assert target.read_text() == "written without asking\n"
    assert started(run)["mode"] == "accept_edits"


def test_a_chosen_model_names_the_next_request_hermes_makes(
    api: Client, runner: Proc, session: Any, scripted_llm: ScriptedLLM
) -> None:
    first_turn(session, runner, scripted_llm)
    assert scripted_llm.scripted_requests[-1]["model"] == "mock-model"
    response = api.patch(f"/api/sessions/{session.pk}", {"model": "mock-model-b"}, content_type=JSON)
    assert response.status_code == 200, response.content

    before = len(scripted_llm.scripted_requests)
    scripted_llm.enqueue(text("Answered by the other model."))
    run = wait_status(run_of(submit(session, "Once more")), RunStatus.COMPLETED, timeout=90, log=runner.log)
    assert "Answered by the other model." in state(run)["text"]
    after = scripted_llm.scripted_requests[before:]
    assert after and all(request["model"] == "mock-model-b" for request in after)
    assert started(run)["model"] == "mock-model-b"
