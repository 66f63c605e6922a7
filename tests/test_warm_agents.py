"""Warm agents (issue 43): a session's agent started before its turn, and the memory budget.

Opening a session page or typing in it asks once per interval (`POST /api/sessions/{id}/warm`);
a runner takes the request from the database — rung by the doorbell, or found by its poll
without one — starts the agent and loads the session, and the next turn reuses that process:
the agent's pid and the runner's count of starts say so, not the time. Idle agents past
HERMESWEB_AGENT_MEMORY_MB are stopped least recently used first, never one with a turn.
Real runner subprocesses, the demo agent and real Hermes offline, a real browser.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from runs.models import RunStatus, WarmRequest
from runs.placement import Offer
from runs.runner.memory import AgentUse, over_budget, tree_rss
from runs.runner.warm import WarmTarget, serves
from runs.warm_requests import recent_requests
from tests import factories
from tests.support.browser import (  # noqa: F401 - fixtures
    Workbench,
    browser,
    open_session,
    screenshots,
    send,
    wait_settled,
    workbench,
)
from tests.support.hermes import AgentConfig
from tests.support.hold import release
from tests.support.procs import Proc, start_runner, wait_for
from tests.support.ptree import alive
from tests.support.runs import run_of, submit, wait_event, wait_status
from tests.support.scripted_llm import ScriptedLLM

pytestmark = pytest.mark.django_db(transaction=True)

STARTED = r"agent {agent} started for project {project} \(pid (\d+)\)"
WARMED = r"session {session}: agent {agent} ready \(pid (\d+)\)"
OVER_BUDGET = "agent demo for project {project} stopped: past the memory budget"


@pytest.fixture(autouse=True)
def _fresh_interval() -> None:
    recent_requests.clear()  # the web side's memory is per process: each test starts afresh


def starts(runner: Proc, agent: str, project: Any) -> list[int]:
    """The pids of the agent processes this runner started for the project, in order."""
    return [int(pid) for pid in re.findall(STARTED.format(agent=agent, project=project.pk), runner.log())]


def warmed_pid(runner: Proc, agent: str, session: Any, timeout: float = 60.0) -> int:
    pattern = re.compile(WARMED.format(session=session.pk, agent=agent))
    found = wait_for(lambda: pattern.search(runner.log()), timeout, what=f"session {session.pk} warmed")
    return int(found.group(1))


def ask(client: Client, session: Any) -> dict[str, Any]:
    response = client.post(f"/api/sessions/{session.pk}/warm")
    assert response.status_code == 202, response.content
    return response.json()


# ---------------------------------------------------------------- the web side


def test_a_warm_request_is_written_once_per_session_per_interval(api: Client, user: Any) -> None:
    session = factories.SessionFactory(project__owner=user)
    assert ask(api, session) == {"requested": True, "reason": "requested"}
    first = WarmRequest.objects.get(pk=session.pk).requested_at
    for _ in range(5):  # keystrokes, reloads: no new row, no new ring
        assert ask(api, session) == {"requested": False, "reason": "recent"}
    assert WarmRequest.objects.get(pk=session.pk).requested_at == first
    other = factories.SessionFactory(project__owner=user)
    assert ask(api, other)["requested"] is True
    assert WarmRequest.objects.count() == 2


def test_a_session_with_a_turn_under_way_or_archived_is_not_warmed(api: Client, user: Any) -> None:
    busy = factories.SessionFactory(project__owner=user)
    factories.RunFactory(session=busy, status=RunStatus.QUEUED)
    assert ask(api, busy) == {"requested": False, "reason": "busy"}
    archived = factories.SessionFactory(project__owner=user, status="archived")
    assert ask(api, archived) == {"requested": False, "reason": "archived"}
    assert not WarmRequest.objects.exists()


def test_a_worktree_session_is_warmed_in_its_worktree_and_not_before_it_exists(
    api: Client, user: Any
) -> None:
    from django.utils import timezone

    from runs.runner.warm import pending_requests
    from worktrees.models import Worktree, WorktreeState

    session = factories.SessionFactory(project__owner=user)
    tree = Worktree.objects.create(
        session=session,
        branch="fix",
        base="main",
        base_commit="0" * 40,
        path="/srv/trees/fix",
        repository=session.project.path,
    )
    assert ask(api, session)["requested"] is True
    assert pending_requests(timezone.now()) == []  # pending: its first turn makes it
    Worktree.objects.filter(pk=tree.pk).update(state=WorktreeState.READY)
    [target] = pending_requests(timezone.now())
    assert (target.cwd, target.project_path) == ("/srv/trees/fix", session.project.path)


def test_someone_elses_session_is_not_found_and_not_warmed(api: Client, other_user: Any) -> None:
    theirs = factories.SessionFactory(project__owner=other_user)
    response = api.post(f"/api/sessions/{theirs.pk}/warm")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"
    assert not WarmRequest.objects.exists()


# ---------------------------------------------------------------- the runner, demo agent


@pytest.mark.parametrize("doorbell", ["redis", "poll"])
def test_a_warmed_agent_is_the_one_the_next_turn_uses(
    runners: list[Proc], logs: Path, api: Client, user: Any, doorbell: str, settings: Any
) -> None:
    if doorbell == "redis" and not settings.REDIS_URL:
        pytest.skip("REDIS_URL is not set")
    env = {"HERMESWEB_DEMO_DELAY": "0.005"}
    if doorbell == "poll":  # no Redis: the request reaches the runner by its poll of the database
        settings.REDIS_URL = ""
        env["REDIS_URL"] = ""
    session = factories.SessionFactory(project__owner=user, project__agent="demo")
    first = start_runner(logs, "before", **env)
    runners.append(first)
    wait_status(run_of(submit(session, "fast one")), RunStatus.COMPLETED, log=first.log)
    assert first.stop() == 0  # its agent goes with it: the session's next turn would start one

    runner = start_runner(logs, "warm", **env)
    runners.append(runner)
    session.refresh_from_db()
    assert session.agent_session_id
    assert ask(api, session)["requested"] is True
    pid = warmed_pid(runner, "demo", session)
    assert starts(runner, "demo", session.project) == [pid]
    assert alive(pid)
    assert not WarmRequest.objects.filter(pk=session.pk).exists()  # taken by the runner

    turn = run_of(submit(session, "fast two"))
    wait_status(turn, RunStatus.COMPLETED, log=runner.log)
    assert starts(runner, "demo", session.project) == [pid]  # no second start: the warm one served
    assert alive(pid)


def test_a_runner_warms_a_session_once_per_interval_however_often_asked(
    runners: list[Proc], logs: Path, api: Client, user: Any
) -> None:
    session = factories.SessionFactory(project__owner=user, project__agent="demo")
    runner = start_runner(logs, "warm-once")
    runners.append(runner)
    ask(api, session)
    warmed_pid(runner, "demo", session)
    # Another web process (its own memory) asks again: the row is written, the runner takes it
    # and does nothing with it within its interval.
    recent_requests.clear()
    ask(api, session)
    wait_for(lambda: not WarmRequest.objects.exists(), 30, what="the second request taken")
    pattern = WARMED.format(session=session.pk, agent="demo")
    assert len(re.findall(pattern, runner.log())) == 1


def test_only_a_runner_that_would_claim_the_sessions_turns_warms_it(allowed_root: Path) -> None:
    from django.utils import timezone

    def target(labels: list[str], cwd: Path = allowed_root / "p", agent: str = "demo") -> WarmTarget:
        return WarmTarget(1, timezone.now(), 1, str(cwd), str(cwd), agent, "", labels)

    here = Offer(labels=("host=build-1",), roots=(str(allowed_root),))
    assert serves(target([]), here)
    assert serves(target(["host=build-1"]), here)
    assert not serves(target(["host=build-2"]), here)  # pinned to another host's runner
    assert not serves(target([], cwd=Path("/elsewhere/p")), here)  # outside this runner's roots
    assert not serves(target([], agent="not-configured-here"), here)


# ---------------------------------------------------------------- the memory budget


def test_the_budget_picks_the_least_recently_used_idle_agents_only() -> None:
    mb = 1024 * 1024
    uses = [
        AgentUse("busy-oldest", 300 * mb, last_used=1.0, active=True),
        AgentUse("idle-old", 100 * mb, last_used=2.0, active=False),
        AgentUse("idle-newer", 100 * mb, last_used=3.0, active=False),
        AgentUse("idle-newest", 100 * mb, last_used=4.0, active=False),
    ]
    assert over_budget(uses, 600 * mb) == []
    assert over_budget(uses, 450 * mb) == ["idle-old", "idle-newer"]
    # Even a budget the busy one alone exceeds never stops it.
    assert over_budget(uses, 1 * mb) == ["idle-old", "idle-newer", "idle-newest"]


def test_a_process_trees_resident_memory_includes_its_childrens() -> None:
    # A child that holds 64 MiB resident: its parent's tree counts it, this process alone does not.
    code = "import sys; b = bytearray(64 << 20); print('ready', flush=True); sys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        alone = tree_rss([child.pid])[child.pid]
        mine = tree_rss([os.getpid()])[os.getpid()]
        assert alone >= 64 * 1024 * 1024
        assert mine >= alone
    finally:
        child.kill()
        child.wait()


def test_the_budget_stops_the_idle_agent_and_never_the_one_with_a_turn(
    runners: list[Proc], logs: Path, user: Any
) -> None:
    # 1 MB: every agent is past it, so whatever the budget may stop, it stops.
    runner = start_runner(logs, "budget", HERMESWEB_AGENT_MEMORY_MB="1", HERMESWEB_DEMO_DELAY="0.005")
    runners.append(runner)
    idle = factories.SessionFactory(project__owner=user, project__agent="demo")
    busy = factories.SessionFactory(project__owner=user, project__agent="demo")
    wait_status(run_of(submit(idle, "fast one")), RunStatus.COMPLETED, log=runner.log)
    [idle_pid] = starts(runner, "demo", idle.project)

    held = run_of(submit(busy, "hold"))
    wait_event(held, "token.delta")
    [busy_pid] = starts(runner, "demo", busy.project)
    wait_for(
        lambda: OVER_BUDGET.format(project=idle.project.pk) in runner.log(), 60, what="the idle agent stopped"
    )
    wait_for(lambda: not alive(idle_pid), 30, what=f"agent {idle_pid} gone")
    assert alive(busy_pid)  # holding a turn: never stopped, whatever the budget
    assert OVER_BUDGET.format(project=busy.project.pk) not in runner.log()

    release(busy.project.path)
    wait_status(held, RunStatus.COMPLETED, log=runner.log)
    # Its turn over, the busy agent is idle too, and the budget takes it at its next look.
    wait_for(lambda: not alive(busy_pid), 60, what=f"agent {busy_pid} stopped once idle")


# ---------------------------------------------------------------- real Hermes


@pytest.mark.hermes
def test_a_warmed_hermes_agent_serves_the_next_turn_with_its_session_loaded(
    runners: list[Proc],
    logs: Path,
    api: Client,
    user: Any,
    settings: Any,
    hermes_agent_config: AgentConfig,
    scripted_llm: ScriptedLLM,
) -> None:
    from runs.agents import load_agents

    agents_env = {"HERMESWEB_AGENTS": json.dumps({"hermes": hermes_agent_config})}
    configured = load_agents(settings.DATA_DIR, agents_env)
    settings.HERMESWEB_AGENTS = {**settings.HERMESWEB_AGENTS, "hermes": configured["hermes"]}
    session = factories.SessionFactory(project__owner=user, project__agent="hermes")
    scripted_llm.enqueue("Noted: ORCHID-7.", "Still ORCHID-7.")

    first = start_runner(logs, "hermes-before", **agents_env)
    runners.append(first)
    wait_status(run_of(submit(session, "Remember ORCHID-7")), RunStatus.COMPLETED, timeout=90, log=first.log)
    assert first.stop() == 0

    runner = start_runner(logs, "hermes-warm", **agents_env)
    runners.append(runner)
    session.refresh_from_db()
    ask(api, session)
    pid = warmed_pid(runner, "hermes", session, timeout=120)
    assert starts(runner, "hermes", session.project) == [pid]

    turn = run_of(submit(session, "What was it?"))
    wait_status(turn, RunStatus.COMPLETED, timeout=90, log=runner.log)
    assert starts(runner, "hermes", session.project) == [pid]
    assert alive(pid)
    # The warm-up's load gave the agent its history: the model saw the first turn again.
    follow_up = scripted_llm.scripted_requests[-1]
    assert "Remember ORCHID-7" in json.dumps(follow_up)


# ---------------------------------------------------------------- the page


@pytest.mark.browser
def test_opening_a_session_and_typing_sends_one_warm_request_and_the_turn_reuses_the_agent(
    workbench: Workbench, user: Any
) -> None:
    session = factories.SessionFactory(project__owner=user, project__agent="demo")
    page = workbench.new_page()
    asked: list[str] = []
    page.on(
        "request", lambda r: asked.append(r.url) if r.url.endswith(f"/sessions/{session.pk}/warm") else None
    )
    open_session(page, session.pk)
    page.locator(".composer textarea").press_sequentially("hello there, agent")
    assert workbench.runner is not None
    # No Redis in the workbench: the runner found the request by its poll.
    pattern = re.compile(STARTED.format(agent="demo", project=session.project.pk))
    wait_for(lambda: pattern.search(workbench.runner.log()), 60, what="the agent started before the turn")
    assert len(asked) == 1, asked  # the page and twenty keystrokes: one request

    send(page, "fast please")
    wait_settled(page, 1)
    assert len(pattern.findall(workbench.runner.log())) == 1
