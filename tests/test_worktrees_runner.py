"""Worktree sessions with a runner and the demo agent in its sandbox (docs/worktrees.md).

Two sessions edit the same file at once, each in its own worktree; the main checkout sees
nothing until a merge; the agent commits on its branch from inside the sandbox; a runner
restart keeps the worktree; a missing one fails the turn instead of running in the main checkout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from projects.models import Session
from runs.models import RunStatus
from tests import factories
from tests.support.procs import Proc, wait_for
from tests.support.runs import run_of, submit, wait_status
from tests.support.workspace import shell_runner, turn
from tests.support.worktrees import create_session, git, make_repo, merge, state
from worktrees.models import Worktree

pytestmark = pytest.mark.django_db(transaction=True)

# Edits shared.txt, commits it on the session's branch (from inside the sandbox), then holds
# until the test creates `go`: both turns are running at once while the test looks.
HELD = (
    "printf 'one\\nTWO by {who}\\nthree\\n' > shared.txt && git add shared.txt && "
    "git -c user.name=agent -c user.email=agent@example.com commit --quiet -m '{who} edits' && "
    "touch edited; while [ ! -e go ]; do sleep 0.02; done; rm -f go edited"
)


@pytest.fixture
def worktree_root(tmp_path: Path, settings: Any) -> Path:
    settings.HERMESWEB_WORKTREE_ROOT = str(tmp_path / "worktrees")
    return tmp_path / "worktrees"


@pytest.fixture
def runner(runners: list[Proc], logs: Path, worktree_root: Path) -> Proc:
    return shell_runner(runners, logs, HERMESWEB_WORKTREE_ROOT=str(worktree_root))


@pytest.fixture
def project(user: Any) -> Any:
    project = factories.ProjectFactory(owner=user, agent="demo")
    make_repo(project.path)
    return project


def tree_of(session_id: int) -> Path:
    return Path(Worktree.objects.get(session_id=session_id).path)


def test_two_sessions_edit_one_file_at_once_in_their_worktrees_then_merge_and_conflict(
    api: Client, project: Any, runner: Proc
) -> None:
    repo = Path(project.path)
    ids = [create_session(api, project.pk, branch=who).json()["id"] for who in ("first", "second")]
    runs = [
        run_of(submit(Session.objects.get(pk=sid), f"shell {HELD.format(who=who)}"))
        for sid, who in zip(ids, ("first", "second"), strict=True)
    ]
    for sid in ids:
        wait_for(lambda sid=sid: (tree_of(sid) / "edited").exists(), 90, what="both turns to edit")
    assert all(r.status == RunStatus.RUNNING for r in [type(r).objects.get(pk=r.pk) for r in runs])
    assert (tree_of(ids[0]) / "shared.txt").read_text() == "one\nTWO by first\nthree\n"
    assert (tree_of(ids[1]) / "shared.txt").read_text() == "one\nTWO by second\nthree\n"
    assert (repo / "shared.txt").read_text() == "one\ntwo\nthree\n"
    assert git(repo, "status", "--porcelain") == "" and git(repo, "rev-list", "--count", "main") == "1"
    for sid in ids:
        (tree_of(sid) / "go").touch()
    for run in runs:
        wait_status(run, RunStatus.COMPLETED, timeout=90, log=runner.log)
    # The agent's commits, made in the sandbox, are on the branches.
    assert git(repo, "log", "-1", "--format=%an %s", "first") == "agent first edits"
    assert api.get(f"/api/sessions/{ids[0]}").json()["worktree"]["ahead"] == 1

    assert merge(api, ids[0]).status_code == 200
    assert (repo / "shared.txt").read_text() == "one\nTWO by first\nthree\n"
    before = state(repo), git(tree_of(ids[1]), "rev-parse", "HEAD")
    conflict = merge(api, ids[1])
    assert conflict.status_code == 409 and conflict.json()["details"] == {"paths": ["shared.txt"]}
    assert (state(repo), git(tree_of(ids[1]), "rev-parse", "HEAD")) == before


def test_a_runner_restart_keeps_the_worktree_and_its_work(
    api: Client, project: Any, runner: Proc, runners: list[Proc], logs: Path, worktree_root: Path
) -> None:
    session = Session.objects.get(pk=create_session(api, project.pk).json()["id"])
    turn(session, "shell echo kept > kept.txt", runner)
    tree = tree_of(session.pk)
    runner.stop()
    again = shell_runner(runners, logs, "again", HERMESWEB_WORKTREE_ROOT=str(worktree_root))
    second = turn(session, "shell cat kept.txt && pwd", again)
    assert tree_of(session.pk) == tree and (tree / "kept.txt").read_text() == "kept\n"
    started = second.events.get(type="run.started").payload
    assert started["workspace"] == str(tree)
    assert not (Path(project.path) / "kept.txt").exists()


def test_a_missing_worktree_fails_the_turn_and_nothing_runs_in_the_main_checkout(
    api: Client, project: Any, runner: Proc
) -> None:
    session = Session.objects.get(pk=create_session(api, project.pk).json()["id"])
    turn(session, "shell true", runner)
    git(project.path, "worktree", "remove", "--force", str(tree_of(session.pk)))
    failed = turn(session, "shell touch escaped.txt", runner, status=RunStatus.FAILED)
    assert "cannot be used" in failed.error and "main checkout" in failed.error
    assert failed.events.filter(type="error", payload__code="worktree_unavailable").exists()
    assert not (Path(project.path) / "escaped.txt").exists()
    assert api.get(f"/api/sessions/{session.pk}").json()["worktree"]["error"] == "its directory is missing"
