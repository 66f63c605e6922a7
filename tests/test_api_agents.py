"""GET /api/agents: the operator's configured agents, whether each can start here, and what its
last `initialize` reported (recorded by the runner that started it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from runs.agents import AgentSpec, bwrap
from runs.models import AgentReport, RunStatus
from tests import factories
from tests.support.procs import Proc, start_runner
from tests.support.runs import run_of, submit, wait_status


def by_name(api: Client) -> dict[str, dict[str, Any]]:
    response = api.get("/api/agents")
    assert response.status_code == 200, response.content
    return {a["name"]: a for a in response.json()}


@pytest.mark.django_db
def test_the_configured_agents_are_listed_default_first(api: Client, settings: Any) -> None:
    body = api.get("/api/agents").json()
    names = [a["name"] for a in body]
    assert set(names) == set(settings.HERMESWEB_AGENTS)
    assert body[0]["name"] == settings.HERMESWEB_DEFAULT_AGENT and body[0]["default"] is True
    demo = by_name(api)["demo"]
    assert demo["label"] == "Demo agent"
    assert demo["can_start"] is True and demo["why_not"] == ""
    assert demo["sandbox"] == ("bubblewrap" if bwrap().path else "none")


@pytest.mark.django_db
def test_an_agent_whose_command_is_missing_says_why_it_cannot_start(api: Client, settings: Any) -> None:
    missing = AgentSpec(name="ghost", command="/nonexistent/ghost-acp")
    settings.HERMESWEB_AGENTS = {**settings.HERMESWEB_AGENTS, "ghost": missing}
    ghost = by_name(api)["ghost"]
    assert ghost["can_start"] is False
    assert "not installed" in ghost["why_not"] and "/nonexistent/ghost-acp" in ghost["why_not"]
    assert ghost["sandbox"] == "" and ghost["capabilities"] == {} and ghost["reported_at"] is None


@pytest.mark.django_db
def test_an_agent_requiring_a_sandbox_this_host_lacks_cannot_start(
    api: Client, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import runs.agent_catalog as catalog

    monkeypatch.setattr(catalog, "sandboxed", lambda spec: (False, "bubblewrap (bwrap) is not installed"))
    strict = AgentSpec(name="strict", command=settings.HERMESWEB_AGENTS["demo"].command, sandbox="required")
    settings.HERMESWEB_AGENTS = {**settings.HERMESWEB_AGENTS, "strict": strict}
    entry = by_name(api)["strict"]
    assert entry["can_start"] is False
    assert entry["why_not"] == "it requires the sandbox and bubblewrap (bwrap) is not installed"
    assert entry["sandbox_setting"] == "required"


def test_the_agents_list_needs_a_sign_in(client: Client, db: None) -> None:
    assert client.get("/api/agents").status_code == 401


@pytest.mark.django_db(transaction=True)
def test_a_runner_records_the_capabilities_the_agent_reported_at_initialize(
    runners: list[Proc], logs: Path, user: Any, api: Client
) -> None:
    assert not AgentReport.objects.filter(agent="demo").exists()
    runner = start_runner(logs, "r1", HERMESWEB_DEMO_DELAY="0.005")
    runners.append(runner)
    session = factories.SessionFactory(project__agent="demo", project__owner=user)
    wait_status(run_of(submit(session, "fast hello")), RunStatus.COMPLETED, log=runner.log)
    demo = by_name(api)["demo"]
    assert demo["capabilities"]["loadSession"] is True
    assert "image" in demo["capabilities"]["promptCapabilities"]
    assert demo["agent_info"]["name"] == "hermesweb-demo"
    assert demo["label"] == "hermesweb demo agent"  # its own title, once it reported one
    assert demo["reported_at"] is not None
