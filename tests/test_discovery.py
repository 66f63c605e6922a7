"""Session discovery and import, end to end: a real runner, the real demo agent, the API.

The agent sessions are made outside hermesweb: the test drives the demo agent
directly with the ACP SDK, using the store the runner's demo agent uses for the
project's owner (its state directory: runs.agents.agent_state_dir), so only the
agent knows about them until hermesweb discovers and imports them. An import
takes only an id the project's latest discovery listed (docs/security.md).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from acp import text_block
from django.conf import settings
from django.test import Client

from projects.models import Session
from runs.agents import agent_state_dir
from runs.demo_agent.store import DEFAULT_HOME
from runs.models import AgentJob, AgentJobKind, Run, RunSource, RunStatus
from tests import factories
from tests.support.acp_client import demo_agent
from tests.support.procs import Proc, start_runner, wait_for
from tests.support.runs import assert_journal_well_formed, state, wait_status

pytestmark = pytest.mark.django_db(transaction=True)


def demo_store(user: Any) -> Path:
    """Where the runner's demo agent keeps `user`'s sessions: $HOME/.hermesweb-demo-agent."""
    return agent_state_dir(settings.DATA_DIR, user.pk, "demo") / Path(DEFAULT_HOME).name


@dataclass
class OutsideSession:
    """An agent session made without hermesweb, and what the agent said in each turn."""

    agent_session_id: str
    prompts: list[str]
    texts: list[str]
    reasoning: list[str]


def make_outside_sessions(cwds: list[str], prompts: list[str], log: Path, home: Path) -> list[OutsideSession]:
    """One demo-agent session per cwd in the store `home`, `prompts` its turns, through the SDK."""

    async def body() -> list[OutsideSession]:
        made = []
        with log.open("ab") as stderr:
            async with demo_agent(home, stderr=stderr) as agent:
                for cwd in cwds:
                    sid = (await agent.conn.new_session(cwd=cwd, mcp_servers=[])).session_id
                    texts, reasoning = [], []
                    for prompt in prompts:
                        mark = agent.client.mark()
                        await agent.conn.prompt(session_id=sid, prompt=[text_block(prompt)])
                        turn = [u for s, u in agent.client.updates[mark:] if s == sid]
                        texts.append(_joined(turn, "agent_message_chunk"))
                        reasoning.append(_joined(turn, "agent_thought_chunk"))
                    made.append(OutsideSession(sid, prompts, texts, reasoning))
        return made

    return asyncio.run(asyncio.wait_for(body(), 60))


def _joined(updates: list[Any], kind: str) -> str:
    return "".join(u.content.text for u in updates if u.session_update == kind and hasattr(u.content, "text"))


@pytest.fixture
def runner(runners: list[Proc], logs: Path) -> Proc:
    proc = start_runner(logs, "discovery", HERMESWEB_DEMO_DELAY="0.002")
    runners.append(proc)
    return proc


@pytest.fixture
def project(user: Any) -> Any:
    return factories.ProjectFactory(owner=user, agent="demo")


def wait_job(client: Client, job: dict[str, Any], runner: Proc, timeout: float = 40.0) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        body = client.get(f"/api/jobs/{job['id']}").json()
        return body if body["state"] in ("done", "failed") else None

    try:
        return wait_for(finished, timeout, what=f"job {job['id']} ({job['kind']}) to finish")
    except AssertionError:
        print(runner.log())
        raise


def discover(client: Client, project: Any, runner: Proc) -> dict[str, Any]:
    response = client.post(f"/api/projects/{project.pk}/discover")
    assert response.status_code == 202, response.content
    job = response.json()
    assert job["kind"] == "list_sessions" and job["state"] in ("pending", "running")
    return wait_job(client, job, runner)


def import_(client: Client, project: Any, agent_session_id: str, runner: Proc) -> dict[str, Any]:
    """Discover, then import (an id the latest discovery did not list is refused)."""
    assert agent_session_id in {
        s["agent_session_id"] for s in discover(client, project, runner)["result"]["sessions"]
    }
    response = client.post(
        f"/api/projects/{project.pk}/import",
        {"agent_session_id": agent_session_id},
        content_type="application/json",
    )
    assert response.status_code == 202, response.content
    return wait_job(client, response.json(), runner)


def test_discovery_lists_the_agents_own_sessions_in_the_project_directory_only(
    api: Client, user: Any, project: Any, runner: Proc, tmp_path: Path, logs: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    here, there = make_outside_sessions(
        [project.path, str(elsewhere)], ["fast hello there"], logs / "outside-agent.log", demo_store(user)
    )
    job = discover(api, project, runner)
    assert job["state"] == "done", job
    listed = {s["agent_session_id"]: s for s in job["result"]["sessions"]}
    assert here.agent_session_id in listed and there.agent_session_id not in listed
    entry = listed[here.agent_session_id]
    assert entry["cwd"] == project.path
    assert entry["title"] == "Fast hello there"  # the demo agent titles a session from its first prompt
    assert entry["updated_at"] and entry["session_id"] is None  # not imported yet
    assert job["result"]["truncated"] is False


def test_import_journals_the_history_once_as_completed_turns_and_is_idempotent(
    api: Client, user: Any, project: Any, runner: Proc, logs: Path
) -> None:
    prompts = ["fast think about the parser", "fast tool please"]
    [outside] = make_outside_sessions([project.path], prompts, logs / "outside-agent.log", demo_store(user))

    job = import_(api, project, outside.agent_session_id, runner)
    assert job["state"] == "done", job
    result = job["result"]
    assert result["created"] is True and result["turns"] == 2
    session = Session.objects.get(pk=result["session_id"])
    assert session.project_id == project.pk
    assert session.agent_session_id == outside.agent_session_id
    assert session.title == "Fast think about the parser"  # the agent's title, from load
    assert any(c["name"] == "steer" for c in session.commands)

    turns = list(Run.objects.filter(session=session).order_by("created_at", "id"))
    assert [t.prompt_text for t in turns] == prompts
    assert {t.source for t in turns} == {RunSource.IMPORT}
    assert {t.status for t in turns} == {RunStatus.COMPLETED}
    for turn, text, reasoning in zip(turns, outside.texts, outside.reasoning, strict=True):
        assert_journal_well_formed(turn)
        materialized = state(turn)
        assert materialized["terminal_state"] == "completed"
        assert materialized["text"] == text and text
        assert materialized["reasoning"] == reasoning
    assert state(turns[0])["reasoning"]  # `think`: the thoughts came back with the history
    [tool] = state(turns[1])["tools"].values()
    assert tool["tool_kind"] == "execute" and tool["status"] == "completed"

    # The transcript API shows the imported turns like any others.
    transcript = api.get(f"/api/sessions/{session.pk}/transcript").json()
    assert [t["prompt_text"] for t in transcript["turns"]] == prompts

    again = import_(api, project, outside.agent_session_id, runner)
    assert again["state"] == "done"
    assert again["result"]["session_id"] == session.pk and again["result"]["created"] is False
    assert Session.objects.filter(agent_session_id=outside.agent_session_id).count() == 1
    assert Run.objects.filter(session=session).count() == 2

    listed = discover(api, project, runner)["result"]["sessions"]
    assert {s["agent_session_id"]: s["session_id"] for s in listed}[outside.agent_session_id] == session.pk


def test_a_new_message_in_an_imported_session_continues_the_same_agent_session(
    api: Client, user: Any, project: Any, runner: Proc, logs: Path
) -> None:
    store = demo_store(user)
    [outside] = make_outside_sessions(
        [project.path], ["fast first question"], logs / "outside-agent.log", store
    )
    session_id = import_(api, project, outside.agent_session_id, runner)["result"]["session_id"]

    response = api.post(
        f"/api/sessions/{session_id}/messages",
        {"client_id": "after-import", "text": "fast second question"},
        content_type="application/json",
    )
    assert response.status_code == 202, response.content
    run = Run.objects.get(pk=response.json()["run_id"])
    wait_status(run, RunStatus.COMPLETED, log=runner.log)
    assert_journal_well_formed(run)
    assert "second question" in state(run)["text"]
    assert not any(e.type == "progress" for e in run.events.all())  # no "starting a new one"

    session = Session.objects.get(pk=session_id)
    assert session.agent_session_id == outside.agent_session_id
    # The agent appended the turn to the session it already had: both prompts are in its history.
    stored = json.loads((store / "sessions" / f"{outside.agent_session_id}.json").read_text())
    prompts = [
        entry["content"]["text"]
        for entry in stored["history"]
        if entry["sessionUpdate"] == "user_message_chunk"
    ]
    assert prompts == ["fast first question", "fast second question"]


def test_importing_a_session_the_agent_does_not_know_fails_with_a_coded_error(
    api: Client, user: Any, project: Any, runner: Proc, logs: Path
) -> None:
    # Discovered, then gone from the agent's store before the import reached the agent.
    store = demo_store(user)
    [outside] = make_outside_sessions([project.path], ["fast soon gone"], logs / "outside-agent.log", store)
    sid = outside.agent_session_id
    assert sid in {s["agent_session_id"] for s in discover(api, project, runner)["result"]["sessions"]}
    (store / "sessions" / f"{sid}.json").unlink()
    response = api.post(
        f"/api/projects/{project.pk}/import", {"agent_session_id": sid}, content_type="application/json"
    )
    job = wait_job(api, response.json(), runner)
    assert job["state"] == "failed"
    assert job["error"]["code"] == "load_failed" and sid in job["error"]["message"]
    assert job["result"] is None
    assert not Session.objects.filter(agent_session_id=sid).exists()


def test_an_id_the_discovery_did_not_list_is_not_imported(api: Client, project: Any, runner: Proc) -> None:
    discover(api, project, runner)
    response = api.post(
        f"/api/projects/{project.pk}/import",
        {"agent_session_id": "no-such-session"},
        content_type="application/json",
    )
    assert response.status_code == 404 and response.json()["code"] == "not_found"
    assert not AgentJob.objects.filter(kind=AgentJobKind.IMPORT_SESSION).exists()
