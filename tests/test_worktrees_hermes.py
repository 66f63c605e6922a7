"""Worktree sessions with the real Hermes Agent, offline (docs/worktrees.md; tests/support/hermes.py).

Two Hermes sessions, each in its own worktree, edit the same file through Hermes' `write_file`
tool and commit it with its `terminal` tool from inside the sandbox; the main checkout is
untouched until the first merges; the second's merge reports the conflict and changes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from projects.models import Session
from runs.models import RunStatus
from tests import factories
from tests.support.hermes import AgentConfig
from tests.support.procs import Proc, start_runner
from tests.support.runs import run_of, submit, wait_status
from tests.support.scripted_llm import ScriptedLLM, text, tool_call
from tests.support.worktrees import create_session, git, make_repo, merge, state
from tests.test_workspace_hermes import finish
from worktrees.models import Worktree

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.hermes]


@pytest.fixture
def runner(runners: list[Proc], logs: Path, hermes_agent_config: AgentConfig, tmp_path: Path) -> Proc:
    agents = json.dumps({"hermes": hermes_agent_config})
    proc = start_runner(
        logs, "hermes-wt", HERMESWEB_AGENTS=agents, HERMESWEB_WORKTREE_ROOT=str(tmp_path / "wt")
    )
    runners.append(proc)
    return proc


@pytest.fixture
def project(db: None, settings: Any, user: Any, hermes_agent_config: AgentConfig, tmp_path: Path) -> Any:
    from runs.agents import load_agents

    configured = load_agents(
        settings.DATA_DIR, {"HERMESWEB_AGENTS": json.dumps({"hermes": hermes_agent_config})}
    )
    settings.HERMESWEB_AGENTS = {**settings.HERMESWEB_AGENTS, "hermes": configured["hermes"]}
    settings.HERMESWEB_WORKTREE_ROOT = str(tmp_path / "wt")
    project = factories.ProjectFactory(owner=user, agent="hermes")
    make_repo(project.path)
    return project


def hermes_edits(scripted_llm: ScriptedLLM, tree: Path, who: str) -> None:
    scripted_llm.enqueue(
        tool_call("write_file", {"path": str(tree / "shared.txt"), "content": f"one\nTWO by {who}\nthree\n"}),
        text("Edited."),
    )
    ident = "-c user.name=hermes -c user.email=h@example.com"
    commit = f"cd {tree} && git add shared.txt && git {ident} commit -qm '{who}'"
    scripted_llm.enqueue(tool_call("terminal", {"command": commit}), text("Committed."))


def test_two_hermes_sessions_in_worktrees_edit_one_file_then_merge_and_conflict(
    api: Client, project: Any, runner: Proc, scripted_llm: ScriptedLLM
) -> None:
    repo = Path(project.path)
    ids = [create_session(api, project.pk, branch=who).json()["id"] for who in ("first", "second")]
    trees = [Path(Worktree.objects.get(session_id=sid).path) for sid in ids]
    for sid, tree, who in zip(ids, trees, ("first", "second"), strict=True):
        session = Session.objects.get(pk=sid)
        hermes_edits(scripted_llm, tree, who)
        finish(run_of(submit(session, "Edit shared.txt")), runner)
        finish(run_of(submit(session, "Commit it")), runner)
        assert (tree / "shared.txt").read_text() == f"one\nTWO by {who}\nthree\n"
        assert git(repo, "log", "-1", "--format=%an %s", who) == f"hermes {who}"
    assert (repo / "shared.txt").read_text() == "one\ntwo\nthree\n"
    assert git(repo, "status", "--porcelain") == ""

    assert merge(api, ids[0]).status_code == 200
    assert (repo / "shared.txt").read_text() == "one\nTWO by first\nthree\n"
    before = state(repo)
    conflict = merge(api, ids[1])
    assert conflict.status_code == 409 and conflict.json()["details"] == {"paths": ["shared.txt"]}
    assert state(repo) == before


def test_a_hermes_turn_in_a_discarded_worktree_fails_and_never_runs_in_the_main_checkout(
    api: Client, project: Any, runner: Proc, scripted_llm: ScriptedLLM
) -> None:
    sid = create_session(api, project.pk).json()["id"]
    session = Session.objects.get(pk=sid)
    scripted_llm.enqueue(text("Hello."))
    finish(run_of(submit(session, "Hi")), runner)
    assert api.delete(f"/api/sessions/{sid}/worktree").status_code == 200
    failed = wait_status(run_of(submit(session, "Again")), RunStatus.FAILED, RunStatus.COMPLETED, timeout=90)
    failed.refresh_from_db()
    assert failed.status == RunStatus.FAILED and "discarded" in failed.error
    assert git(project.path, "status", "--porcelain") == ""
