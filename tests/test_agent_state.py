"""Per-user agent state: each user's agent sessions live in a state directory of their own.

Issue 22 item 2; docs/security.md ("Per-user agent state"). The runner gives each agent
process HOME = DATA_DIR/agents/<project owner id>/<agent> (and HERMES_HOME for Hermes:
tests/test_sandbox_hermes.py), so the demo agent's session store is the owner's own.
Discovery then lists only the owner's sessions, and an import takes only an id the
project's latest discovery listed: another user's agent session id answers 404, and even a
job that reached the agent would find nothing in this user's store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from projects.models import Session
from runs.agents import AgentSpec, agent_state_dir
from runs.models import AgentJob, AgentJobKind, AgentJobState, RunStatus
from runs.runner.sandbox import agent_env
from tests import factories
from tests.support.procs import Proc, start_runner, wait_for
from tests.support.runs import refreshed, run_of, submit, wait_status
from tests.test_discovery import demo_store, discover, make_outside_sessions


def test_a_state_directory_per_user_and_agent() -> None:
    data = Path("/srv/data")
    assert agent_state_dir(data, 7, "hermes") == Path("/srv/data/agents/7/hermes")
    assert agent_state_dir(data, 7, "demo") != agent_state_dir(data, 8, "demo")
    # An operator's odd agent name still makes one directory inside the user's.
    assert agent_state_dir(data, 7, "../x/y") == Path("/srv/data/agents/7/_x_y")


def test_home_is_the_state_directory_whatever_the_entry_says() -> None:
    spec = AgentSpec(name="custom", command="/bin/agent", env={"HOME": "/srv/shared", "KEY": "v"})
    env = agent_env(spec, Path("/d/agents/2/custom"), sandboxed=False, environ={"PATH": "/usr/bin"})
    assert env["HOME"] == "/d/agents/2/custom" and env["KEY"] == "v"
    assert "HERMES_HOME" not in env  # not Hermes: nothing else is rewritten


@pytest.fixture
def runner(runners: list[Proc], logs: Path) -> Proc:
    proc = start_runner(logs, "agent-state", HERMESWEB_DEMO_DELAY="0.002")
    runners.append(proc)
    return proc


@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_another_users_agent_sessions_are_neither_discovered_nor_imported(
    runner: Proc, logs: Path, user: Any, other_user: Any
) -> None:
    alice, bob = user, other_user
    alices = factories.ProjectFactory(owner=alice, agent="demo")
    bobs = factories.ProjectFactory(owner=bob, agent="demo")

    # Alice's turn: its agent session lands in Alice's store, not Bob's.
    turn = run_of(submit(factories.SessionFactory(project=alices), "fast hello from alice"))
    wait_status(turn, RunStatus.COMPLETED, log=runner.log)
    sid = refreshed(turn).session.agent_session_id
    assert (demo_store(alice) / "sessions" / f"{sid}.json").is_file()
    assert not (demo_store(bob) / "sessions" / f"{sid}.json").exists()
    assert demo_store(alice).is_relative_to(agent_state_dir(settings.DATA_DIR, alice.pk, "demo"))

    # A session of Alice's agent in the very directory of Bob's project (a shared store would
    # have listed it for Bob: discovery filters by directory only).
    [in_bobs_dir] = make_outside_sessions(
        [bobs.path], ["fast alice was here"], logs / "outside-agent.log", demo_store(alice)
    )
    alice_api, bob_api = Client(), Client()
    alice_api.force_login(alice)
    bob_api.force_login(bob)

    listed_for_bob = discover(bob_api, bobs, runner)["result"]["sessions"]
    assert listed_for_bob == []
    for stolen in (sid, in_bobs_dir.agent_session_id):
        response = bob_api.post(
            f"/api/projects/{bobs.pk}/import", {"agent_session_id": stolen}, content_type="application/json"
        )
        assert response.status_code == 404 and response.json()["code"] == "not_found"
    assert not AgentJob.objects.filter(kind=AgentJobKind.IMPORT_SESSION).exists()

    # Alice's own discovery of her project still lists her session.
    listed_for_alice = discover(alice_api, alices, runner)["result"]["sessions"]
    assert [s["agent_session_id"] for s in listed_for_alice] == [sid]

    # Past the API (a job written directly), Bob's agent has its own store: nothing to load.
    job = AgentJob.objects.create(
        project=bobs,
        kind=AgentJobKind.IMPORT_SESSION,
        payload={"agent_session_id": in_bobs_dir.agent_session_id},
    )
    job = wait_for(lambda: _finished(job), 40, what="the direct import job")
    assert (job.state, job.error_code) == (AgentJobState.FAILED, "load_failed"), job.error
    assert not Session.objects.filter(project=bobs).exists()


def _finished(job: AgentJob) -> AgentJob | None:
    job.refresh_from_db()
    return job if job.state in (AgentJobState.DONE, AgentJobState.FAILED) else None
