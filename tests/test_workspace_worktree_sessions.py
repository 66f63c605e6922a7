"""The Files panel's routes follow a worktree session's tree (docs/worktrees.md, docs/workspace.md).

With `?session=<id>` the files, search and git routes act on that session's own worktree —
listing, reading, saving, `@` search, its branch and dirty files, a commit on its branch — and
leave the main checkout exactly as it was; another user's session, or one of another project,
is a 404. Real git, worktrees made by the runner (and by its own steps, for the quick cases).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from projects.models import Session
from tests import factories
from tests.support.procs import Proc
from tests.support.workspace import shell, shell_runner
from tests.support.worktrees import create_session, git, made, make_repo, state

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worktree_root(tmp_path: Path, settings: Any) -> Path:
    settings.HERMESWEB_WORKTREE_ROOT = str(tmp_path / "worktrees")
    return tmp_path / "worktrees"


@pytest.fixture
def project(user: Any) -> Any:
    project = factories.ProjectFactory(owner=user, agent="demo")
    make_repo(project.path, {"shared.txt": "one\n", "src/app.py": "print('main')\n"})
    return project


@pytest.fixture
def session_tree(api: Client, project: Any, worktree_root: Path) -> tuple[int, Path]:
    answer = create_session(api, project.pk, branch="fix/files")
    assert answer.status_code in (200, 201), answer.content
    sid = answer.json()["id"]
    return sid, made(sid)


def files_url(project: Any, sid: int | None, route: str = "files", **query: str) -> str:
    params = "&".join(f"{k}={v}" for k, v in {**query, **({"session": str(sid)} if sid else {})}.items())
    return f"/api/projects/{project.pk}/{route}?{params}"


def test_listing_reading_and_saving_act_on_the_worktree_not_the_main_checkout(
    api: Client, project: Any, session_tree: tuple[int, Path]
) -> None:
    sid, tree = session_tree
    repo = Path(project.path)
    (tree / "only-in-worktree.txt").write_text("branch work\n")
    (tree / "shared.txt").write_text("one\nworktree\n")
    before = state(repo)

    listed = api.get(files_url(project, sid, path="")).json()
    assert "only-in-worktree.txt" in [e["name"] for e in listed["entries"]]
    main_listed = api.get(files_url(project, None, path="")).json()
    assert "only-in-worktree.txt" not in [e["name"] for e in main_listed["entries"]]

    read = api.get(files_url(project, sid, "files/content", path="shared.txt"))
    assert read.status_code == 200 and read.content == b"one\nworktree\n"
    saved = api.generic(
        "PUT",
        files_url(project, sid, "files/content", path="shared.txt"),
        b"saved in the worktree\n",
        content_type="application/octet-stream",
        HTTP_IF_MATCH=read["ETag"],
    )
    assert saved.status_code == 200, saved.content
    assert (tree / "shared.txt").read_bytes() == b"saved in the worktree\n"
    assert (repo / "shared.txt").read_text() == "one\n"
    assert state(repo) == before


def test_at_search_finds_the_worktrees_paths(
    api: Client, project: Any, session_tree: tuple[int, Path]
) -> None:
    sid, tree = session_tree
    (tree / "src" / "branch_only.py").write_text("x = 1\n")
    found = api.get(files_url(project, sid, "files/search", q="branch_only")).json()
    assert "src/branch_only.py" in [m["path"] for m in found["matches"]]
    found_main = api.get(files_url(project, None, "files/search", q="branch_only")).json()
    assert found_main["matches"] == []


def test_git_panel_shows_the_worktrees_branch_and_commits_on_it(
    api: Client, project: Any, session_tree: tuple[int, Path]
) -> None:
    sid, tree = session_tree
    repo = Path(project.path)
    (tree / "shared.txt").write_text("one\nfixed\n")
    before = state(repo)

    seen = api.get(files_url(project, sid, "git")).json()
    assert seen["repository"] is True and seen["branch"] == "fix/files"
    assert [(f["path"], f["worktree"]) for f in seen["files"]] == [("shared.txt", "M")]
    assert api.get(files_url(project, None, "git")).json()["branch"] == "main"

    body = {"message": "Fix from the panel", "paths": ["shared.txt"], "client_id": uuid.uuid4().hex}
    committed = api.post(files_url(project, sid, "git/commit"), body, content_type="application/json")
    assert committed.status_code == 200, committed.content
    assert committed.json()["branch"] == "fix/files"
    assert git(tree, "rev-parse", "fix/files") == committed.json()["commit"]
    assert git(tree, "show", "fix/files:shared.txt") == "one\nfixed"
    assert git(tree, "status", "--porcelain") == ""  # the worktree's own index followed
    assert api.get(files_url(project, sid, "git")).json()["files"] == []
    # The main checkout: its branch, index and files exactly as before (the new branch ref aside).
    assert state(repo)[1:] == before[1:]
    assert git(repo, "rev-parse", "main") == git(repo, "rev-parse", "HEAD")
    assert git(repo, "log", "--format=%s", "-1", "main") == "initial"


def test_another_users_session_or_another_projects_is_refused(
    api: Client, project: Any, session_tree: tuple[int, Path], other_user: Any
) -> None:
    sid, _ = session_tree
    stranger = Client()
    stranger.force_login(other_user)
    theirs = factories.ProjectFactory(owner=other_user)
    for route, query in (("files", {"path": ""}), ("files/search", {"q": "s"}), ("git", {})):
        answer = stranger.get(files_url(theirs, sid, route, **query))
        assert answer.status_code == 404, (route, answer.content)
        assert answer.json()["code"] == "not_found"
    elsewhere = factories.ProjectFactory(owner=project.owner)
    assert api.get(files_url(elsewhere, sid, "files", path="")).status_code == 404
    assert api.get(files_url(project, 2**62, "files", path="")).status_code == 404


def test_a_plain_sessions_tree_is_the_main_checkout(api: Client, project: Any) -> None:
    plain = factories.SessionFactory(project=project)
    listed = api.get(files_url(project, plain.pk, path="")).json()
    assert "shared.txt" in [e["name"] for e in listed["entries"]]
    assert api.get(files_url(project, plain.pk, "git")).json()["branch"] == "main"


def test_the_agents_edit_in_its_worktree_shows_in_that_sessions_files_only(
    api: Client, project: Any, worktree_root: Path, runners: list[Proc], logs: Path
) -> None:
    runner = shell_runner(runners, logs, HERMESWEB_WORKTREE_ROOT=str(worktree_root))
    sid = create_session(api, project.pk, branch="agent/edit").json()["id"]
    shell(Session.objects.get(pk=sid), "printf 'by the agent\\n' > agent.txt", runner)
    read = api.get(files_url(project, sid, "files/content", path="agent.txt"))
    assert read.status_code == 200 and read.content == b"by the agent\n"
    assert api.get(files_url(project, None, "files/content", path="agent.txt")).status_code == 404
    assert not (Path(project.path) / "agent.txt").exists()
