"""Sessions in their own git worktrees, through the API with real git (docs/worktrees.md).

The runner's part (making the worktree before the first turn) is called here as the runner
calls it; tests/test_worktrees_runner.py has the agents.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from projects.models import Session
from runs.models import RunStatus
from tests import factories
from tests.support.worktrees import create_session, git, made, make_repo, merge, state
from worktrees.models import Worktree

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def worktree_root(tmp_path: Path, settings: Any) -> Path:
    settings.HERMESWEB_WORKTREE_ROOT = str(tmp_path / "worktrees")
    return tmp_path / "worktrees"


@pytest.fixture
def repo(project: Any) -> Path:
    return make_repo(project.path)


def test_a_worktree_session_shows_its_branch_and_lives_outside_the_project_and_every_root(
    api: Client, project: Any, repo: Path, worktree_root: Path, allowed_root: Path
) -> None:
    response = create_session(api, project.pk, branch="fix/typo")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["worktree"] == {
        "branch": "fix/typo",
        "base": "main",
        "state": "pending",
        "ahead": 0,
        "behind": 0,
        "dirty": False,
        "error": "",
    }
    tree = made(body["id"])
    assert tree.is_relative_to(worktree_root.resolve()) and not tree.is_relative_to(allowed_root)
    assert (tree / "shared.txt").read_text() == "one\ntwo\nthree\n"
    (tree / "new.txt").write_text("hello\n")
    shown = api.get(f"/api/sessions/{body['id']}").json()["worktree"]
    assert (shown["state"], shown["dirty"]) == ("ready", True)
    assert git(repo, "status", "--porcelain") == ""  # the main checkout does not see it
    listed = api.get(f"/api/projects/{project.pk}/sessions").json()
    assert [s["worktree"]["branch"] for s in listed] == ["fix/typo"]


def test_a_plain_session_has_no_worktree(api: Client, project: Any, repo: Path) -> None:
    body = api.post(f"/api/projects/{project.pk}/sessions", {}, content_type="application/json").json()
    assert body["worktree"] is None


def test_creation_refusals_write_nothing(api: Client, project: Any, user: Any) -> None:
    plain = create_session(api, project.pk)
    assert (plain.status_code, plain.json()["code"]) == (422, "not_a_git_repository")
    make_repo(project.path)
    bad = create_session(api, project.pk, branch="no..dots")
    assert (bad.status_code, bad.json()["code"]) == (422, "invalid_branch")
    git(project.path, "branch", "taken")
    taken = create_session(api, project.pk, branch="taken")
    assert (taken.status_code, taken.json()["code"]) == (409, "branch_exists")
    base = create_session(api, project.pk, base="nope")
    assert (base.status_code, base.json()["code"]) == (422, "invalid_base")
    assert Session.objects.count() == 0 and Worktree.objects.count() == 0
    first = create_session(api, project.pk, branch="twice")
    assert first.status_code == 201
    again = create_session(api, project.pk, branch="twice")  # asked for, not yet made by a runner
    assert (again.status_code, again.json()["code"]) == (409, "branch_exists")


def test_two_worktrees_edit_the_same_file_the_first_merges_the_second_conflicts_and_changes_nothing(
    api: Client, project: Any, repo: Path, user: Any
) -> None:
    first = create_session(api, project.pk, branch="first").json()["id"]
    second = create_session(api, project.pk, branch="second").json()["id"]
    a, b = made(first), made(second)
    (a / "shared.txt").write_text("one\nTWO by first\nthree\n")
    (b / "shared.txt").write_text("one\nTWO by second\nthree\n")
    assert (repo / "shared.txt").read_text() == "one\ntwo\nthree\n"  # untouched until a merge

    done = merge(api, first, message="First's fix")
    assert done.status_code == 200, done.content
    commit = done.json()["commit"]
    assert done.json()["status"] == "merged" and git(repo, "rev-parse", "main") == commit
    assert (repo / "shared.txt").read_text() == "one\nTWO by first\nthree\n"
    assert git(repo, "log", "-1", "--format=%an <%ae>", commit).startswith(user.username)
    assert git(repo, "status", "--porcelain") == ""
    summary = api.get(f"/api/sessions/{first}").json()["worktree"]
    assert (summary["ahead"], summary["behind"], summary["dirty"]) == (0, 0, False)

    before, tree_before = state(repo), (b / "shared.txt").read_text()
    conflict = merge(api, second)
    assert conflict.status_code == 409
    assert conflict.json()["code"] == "merge_conflict"
    assert conflict.json()["details"] == {"paths": ["shared.txt"]}
    assert state(repo) == before and (b / "shared.txt").read_text() == tree_before
    assert git(b, "status", "--porcelain") == " M shared.txt"  # its work still uncommitted, as it was
    assert api.get(f"/api/sessions/{second}").json()["worktree"]["behind"] == 1


@pytest.mark.parametrize("strategy", ["squash", "rebase"])
def test_squash_and_rebase_put_the_branch_on_top_of_a_base_that_moved(
    api: Client, project: Any, repo: Path, strategy: str
) -> None:
    sid = create_session(api, project.pk).json()["id"]
    tree = made(sid)
    (tree / "a.txt").write_text("a\n")
    git(tree, "add", "a.txt")
    git(tree, "commit", "--quiet", "-m", "agent: a")
    (tree / "b.txt").write_text("b\n")  # left uncommitted: the merge commits it
    (repo / "base.txt").write_text("base moved\n")
    git(repo, "add", "base.txt")
    git(repo, "commit", "--quiet", "-m", "base moved")

    done = merge(api, sid, strategy, message="The session's work")
    assert done.status_code == 200, done.content
    head = done.json()["commit"]
    assert git(repo, "rev-parse", "main") == head
    assert {p.name for p in repo.iterdir()} >= {"a.txt", "b.txt", "base.txt", "shared.txt"}
    history = git(repo, "log", "--format=%s|%P", "main").splitlines()
    assert all(len(line.split("|")[1].split()) == 1 for line in history[:-1])  # linear: no merge commit
    subjects = [line.split("|")[0] for line in history]
    if strategy == "squash":
        assert subjects == ["The session's work", "base moved", "initial"]
    else:
        assert subjects == ["The session's work", "agent: a", "base moved", "initial"]
    assert git(tree, "rev-parse", "HEAD") == head and git(tree, "status", "--porcelain") == ""


def test_a_dirty_base_is_refused_and_nothing_moves(api: Client, project: Any, repo: Path) -> None:
    sid = create_session(api, project.pk).json()["id"]
    tree = made(sid)
    (tree / "shared.txt").write_text("changed in the worktree\n")
    (repo / "shared.txt").write_text("uncommitted in the main checkout\n")
    before = state(repo)
    refused = merge(api, sid)
    assert refused.status_code == 409 and refused.json()["code"] == "base_dirty"
    assert refused.json()["details"] == {"paths": ["shared.txt"]}
    assert state(repo) == before and (repo / "shared.txt").read_text() == "uncommitted in the main checkout\n"
    assert git(tree, "status", "--porcelain") == " M shared.txt"


def test_a_merge_is_idempotent_by_client_id(api: Client, project: Any, repo: Path) -> None:
    sid = create_session(api, project.pk).json()["id"]
    (made(sid) / "x.txt").write_text("x\n")
    once = merge(api, sid, client_id="same")
    twice = merge(api, sid, client_id="same")
    assert once.status_code == twice.status_code == 200
    assert once.json()["commit"] == twice.json()["commit"] and twice.json()["duplicate"] is True
    assert git(repo, "rev-list", "--count", "main") == "2"


def test_merge_and_discard_are_refused_while_a_run_is_active(api: Client, project: Any, repo: Path) -> None:
    sid = create_session(api, project.pk).json()["id"]
    made(sid)
    factories.RunFactory(session_id=sid, status=RunStatus.RUNNING)
    for response in (merge(api, sid), api.delete(f"/api/sessions/{sid}/worktree")):
        assert response.status_code == 409 and response.json()["code"] == "session_busy"


def test_discard_removes_the_worktree_and_if_asked_the_branch(api: Client, project: Any, repo: Path) -> None:
    keep = create_session(api, project.pk, branch="keep").json()["id"]
    drop = create_session(api, project.pk, branch="drop").json()["id"]
    kept_tree, dropped_tree = made(keep), made(drop)
    answer = api.delete(f"/api/sessions/{keep}/worktree")
    assert answer.status_code == 200 and answer.json() == {"status": "discarded", "branch_deleted": False}
    answer = api.delete(f"/api/sessions/{drop}/worktree?delete_branch=true")
    assert answer.json() == {"status": "discarded", "branch_deleted": True}
    assert not kept_tree.exists() and not dropped_tree.exists()
    assert git(repo, "branch", "--list", "--format=%(refname:short)").split() == ["keep", "main"]
    assert "keep" not in git(repo, "worktree", "list")
    assert api.get(f"/api/sessions/{keep}").json()["worktree"]["state"] == "discarded"
    assert api.delete(f"/api/sessions/{keep}/worktree").status_code == 200  # safe to repeat


def test_archiving_or_deleting_the_session_removes_the_worktree_and_keeps_the_branch(
    api: Client, project: Any, repo: Path
) -> None:
    archived = create_session(api, project.pk, branch="archived").json()["id"]
    deleted = create_session(api, project.pk, branch="deleted").json()["id"]
    a, d = made(archived), made(deleted)
    patch = api.patch(f"/api/sessions/{archived}", {"status": "archived"}, content_type="application/json")
    assert patch.status_code == 200 and patch.json()["worktree"]["state"] == "archived"
    assert api.delete(f"/api/sessions/{deleted}").status_code == 204
    assert not a.exists() and not d.exists()
    assert set(git(repo, "branch", "--format=%(refname:short)").split()) == {"archived", "deleted", "main"}
    api.patch(f"/api/sessions/{archived}", {"status": "active"}, content_type="application/json")
    assert made(archived) == a and a.is_dir()  # restored: remade from its branch before the next turn


def test_someone_elses_session_worktree_is_not_found(api: Client, other_user: Any, repo: Path) -> None:
    theirs = factories.SessionFactory(project=factories.ProjectFactory(owner=other_user))
    assert merge(api, theirs.pk).status_code == 404
    assert api.delete(f"/api/sessions/{theirs.pk}/worktree").status_code == 404


def test_a_workflow_launches_into_a_new_session_in_its_own_worktree_once_per_client_id(
    api: Client, project: Any, repo: Path
) -> None:
    workflow = factories.WorkflowFactory(project=project, name="Triage", prompt_template="Look at {thing}")
    body = {"variables": {"thing": "it"}, "client_id": "launch-1", "worktree": True, "branch": "triage"}
    first = api.post(f"/api/workflows/{workflow.pk}/launch", body, content_type="application/json")
    again = api.post(f"/api/workflows/{workflow.pk}/launch", body, content_type="application/json")
    assert first.status_code == again.status_code == 202, first.content
    session = Session.objects.get(worktree__branch="triage")
    assert session.title == "Triage" and Session.objects.filter(project=project).count() == 1
    missing = {**body, "variables": {}, "client_id": "launch-2", "branch": "other"}
    refused = api.post(f"/api/workflows/{workflow.pk}/launch", missing, content_type="application/json")
    assert refused.status_code == 422 and Worktree.objects.count() == 1
