"""The project's own repository: GET /api/projects/{id}/git, POST /api/projects/{id}/git/commit,
and the `@` search GET /api/projects/{id}/files/search.

A commit takes exactly the ticked files as they are on disk (a change, a new file, a deletion,
the executable bit), authored by the user, leaves every other change where it was, runs none of
the repository's hooks, answers the same client_id with the first commit, and refuses paths
outside, a project that is not a repository and nothing to commit. docs/workspace.md ("Git").
"""

from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from tests import factories

pytestmark = pytest.mark.django_db

AGENT_USER = os.environ.get("HERMESWEB_AGENT_USER") or "hermesweb-agent"

GIT_ENV = {
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": "Setup",
    "GIT_AUTHOR_EMAIL": "setup@example.org",
    "GIT_COMMITTER_NAME": "Setup",
    "GIT_COMMITTER_EMAIL": "setup@example.org",
}


def hand_to_agent(root: Path) -> int | None:
    """The tree owned by the agent account, as a root runner leaves a project (None: not root)."""
    if os.geteuid() != 0:
        return None
    try:
        account = pwd.getpwnam(AGENT_USER)
    except KeyError:
        return None
    for path in [root, *root.rglob("*")]:
        os.chown(path, account.pw_uid, account.pw_gid, follow_symlinks=False)
    return account.pw_uid


def git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "safe.directory=*", *args],
        cwd=root,
        env=GIT_ENV,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


@pytest.fixture
def repo(user: Any) -> Any:
    project = factories.ProjectFactory(owner=user)
    root = Path(project.path)
    git(root, "init", "-q", "-b", "main")
    (root / "a.txt").write_text("one\n")
    (root / "b.txt").write_text("bee\n")
    (root / "gone.txt").write_text("bye\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")
    return project


def commit(
    api: Client, project: Any, paths: list[str], client_id: str = "c1", message: str = "Ticked"
) -> Any:
    return api.post(
        f"/api/projects/{project.pk}/git/commit",
        {"client_id": client_id, "message": message, "paths": paths},
        content_type="application/json",
    )


def test_state_shows_the_branch_and_dirty_files(api: Client, repo: Any) -> None:
    root = Path(repo.path)
    (root / "a.txt").write_text("two\n")
    (root / "gone.txt").unlink()
    (root / "new").mkdir()
    (root / "new" / "c.txt").write_text("sea\n")
    body = api.get(f"/api/projects/{repo.pk}/git").json()
    assert body["repository"] is True and body["branch"] == "main" and len(body["head"]) == 40
    assert {(f["path"], f["index"] + f["worktree"]) for f in body["files"]} == {
        ("a.txt", " M"),
        ("gone.txt", " D"),
        ("new/c.txt", "??"),
    }


def test_a_plain_directory_is_not_a_repository(api: Client, project: Any) -> None:
    body = api.get(f"/api/projects/{project.pk}/git").json()
    assert body == {"repository": False, "branch": None, "head": None, "files": [], "truncated": False}
    refused = commit(api, project, ["x.txt"])
    assert refused.status_code == 409 and refused.json()["code"] == "not_git_repo"


def test_a_commit_takes_exactly_the_ticked_files_authored_by_the_user(
    api: Client, repo: Any, user: Any
) -> None:
    user.first_name, user.last_name, user.email = "Ada", "Lovelace", "ada@example.org"
    user.save()
    root = Path(repo.path)
    (root / "a.txt").write_text("two\n")
    (root / "b.txt").write_text("changed but not ticked\n")
    (root / "gone.txt").unlink()
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "run.sh").chmod(0o755)
    answer = commit(api, repo, ["a.txt", "gone.txt", "run.sh"], message="Tick three")
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["status"] == "committed" and body["branch"] == "main"
    assert git(root, "rev-parse", "HEAD").strip() == body["commit"]
    assert (
        git(root, "log", "-1", "--format=%an <%ae>|%cn|%s")
        == "Ada Lovelace <ada@example.org>|Ada Lovelace|Tick three\n"
    )
    assert git(root, "show", "HEAD:a.txt") == "two\n"
    assert git(root, "ls-tree", "HEAD", "run.sh").startswith("100755 ")
    assert "gone.txt" not in git(root, "ls-tree", "--name-only", "HEAD")
    assert git(root, "show", "HEAD:b.txt") == "bee\n"  # not ticked: still the old bytes
    # The repository's own index follows the commit: only the unticked change is left.
    assert git(root, "status", "--porcelain") == " M b.txt\n"


def test_the_same_client_id_answers_the_first_commit(api: Client, repo: Any) -> None:
    root = Path(repo.path)
    (root / "a.txt").write_text("two\n")
    first = commit(api, repo, ["a.txt"], client_id="same").json()
    (root / "b.txt").write_text("later\n")
    again = commit(api, repo, ["b.txt"], client_id="same").json()
    assert again == {**first, "status": "duplicate"}
    assert git(root, "rev-list", "--count", "HEAD").strip() == "2"


def test_nothing_to_commit_and_paths_outside_are_refused(api: Client, repo: Any) -> None:
    unchanged = commit(api, repo, ["a.txt"])
    assert unchanged.status_code == 409 and unchanged.json()["code"] == "nothing_to_commit"
    for path in ["../escape.txt", "/etc/passwd", ".git/config", ""]:
        refused = commit(api, repo, [path], client_id=f"x{path}")
        assert refused.status_code == 422, path
    outside = commit(api, repo, ["../x"], client_id="o")
    assert outside.json()["code"] == "path_outside"
    (Path(repo.path) / "dir").mkdir()
    (Path(repo.path) / "dir" / "f").write_text("f\n")
    assert commit(api, repo, ["dir"], client_id="d").json()["code"] == "not_a_file"
    assert git(Path(repo.path), "rev-list", "--count", "HEAD").strip() == "1"


def test_the_repositorys_hooks_and_fsmonitor_never_run(api: Client, repo: Any, tmp_path: Path) -> None:
    root = Path(repo.path)
    witness = tmp_path / "ran"
    hook = root / ".git" / "hooks" / "pre-commit"
    hook.write_text(f'#!/bin/sh\necho "$0 $(tr "\\\\0" " " < /proc/$PPID/cmdline)" >> {witness}\ncat\n')
    hook.chmod(0o755)
    (root / ".git" / "hooks" / "post-commit").symlink_to(hook)
    (root / ".git" / "hooks" / "reference-transaction").symlink_to(hook)
    git(root, "config", "core.fsmonitor", str(hook))
    git(root, "config", "commit.gpgSign", "true")
    # A filter driver runs whenever git reads the working tree: it never does here.
    git(root, "config", "filter.evil.clean", str(hook))
    git(root, "config", "filter.evil.process", str(hook))
    (root / ".git" / "info" / "attributes").write_text("* filter=evil\n")
    (root / ".gitattributes").write_text("* filter=evil\n")
    (root / "a.txt").write_text("two\n")
    state = api.get(f"/api/projects/{repo.pk}/git").json()
    assert {f["path"] for f in state["files"]} == {"a.txt", ".gitattributes"}
    assert commit(api, repo, ["a.txt"]).status_code == 200
    assert not witness.exists(), witness.read_text()
    assert git(root, "show", "HEAD:a.txt") == "two\n"  # the bytes on disk, no filter


def test_what_git_wrote_is_handed_back_to_the_projects_owner(api: Client, repo: Any) -> None:
    root = Path(repo.path)
    uid = hand_to_agent(root)
    if uid is None:
        pytest.skip("needs root and the agent account")
    (root / "a.txt").write_text("two\n")
    os.chown(root / "a.txt", uid, uid)
    body = commit(api, repo, ["a.txt"]).json()
    assert body["status"] == "committed"
    owners = {p.stat().st_uid for p in (root / ".git").rglob("*")}
    assert owners == {uid}  # nothing of root's left in the agent's repository (objects, index, logs)


def test_a_symlinked_git_directory_is_not_a_repository(api: Client, repo: Any, tmp_path: Path) -> None:
    other = factories.ProjectFactory(owner=repo.owner)
    (Path(other.path) / ".git").symlink_to(Path(repo.path) / ".git")
    assert api.get(f"/api/projects/{other.pk}/git").json()["repository"] is False


def test_another_users_project_is_not_found(other_user: Any, repo: Any) -> None:
    stranger = Client()
    stranger.force_login(other_user)
    assert stranger.get(f"/api/projects/{repo.pk}/git").status_code == 404
    assert commit(stranger, repo, ["a.txt"]).status_code == 404
    assert stranger.get(f"/api/projects/{repo.pk}/files/search?q=a").status_code == 404


# ---------------------------------------------------------------- the @ search


def test_search_is_fuzzy_best_first_and_skips_heavy_and_ignored_dirs(api: Client, project: Any) -> None:
    root = Path(project.path)
    (root / "src" / "app").mkdir(parents=True)
    (root / "src" / "app" / "views.py").write_text("")
    (root / "src" / "viewer.js").write_text("")
    (root / "docs").mkdir()
    (root / "docs" / "overview.md").write_text("")
    for heavy in ["node_modules/pkg", ".git/objects", "out"]:
        (root / heavy).mkdir(parents=True)
        (root / heavy / "views.py").write_text("")
    (root / ".gitignore").write_text("# build\nout/\n")
    body = api.get(f"/api/projects/{project.pk}/files/search?q=view").json()
    paths = [m["path"] for m in body["matches"]]
    assert paths[:2] == ["src/viewer.js", "src/app/views.py"]  # the name holds it: shorter first
    assert "docs/overview.md" in paths  # the name holds it too
    assert not any(p.startswith(("node_modules", ".git/", "out/")) for p in paths)
    spread = api.get(f"/api/projects/{project.pk}/files/search?q=sapvw").json()
    assert [m["path"] for m in spread["matches"]] == ["src/app/views.py"]
    top = api.get(f"/api/projects/{project.pk}/files/search?q=").json()
    assert ("src", "dir") in [(m["path"], m["type"]) for m in top["matches"]]


def test_search_names_symlinks_but_never_walks_through_them(
    api: Client, project: Any, tmp_path: Path
) -> None:
    outside = tmp_path / "secret-place"
    outside.mkdir()
    (outside / "secret.txt").write_text("no")
    (Path(project.path) / "link").symlink_to(outside)
    body = api.get(f"/api/projects/{project.pk}/files/search?q=secret").json()
    assert body["matches"] == []
    linked = api.get(f"/api/projects/{project.pk}/files/search?q=link").json()
    assert linked["matches"] == [{"path": "link", "type": "symlink"}]


def test_search_stops_at_its_cap(api: Client, project: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from workspace import search

    monkeypatch.setattr(search, "MAX_VISITED", 30)
    for n in range(40):
        (Path(project.path) / f"f{n:02}.txt").write_text("")
    body = api.get(f"/api/projects/{project.pk}/files/search?q=f").json()
    assert body["truncated"] is True and len(body["matches"]) <= 30


def test_the_status_follows_each_write_and_chmod(api: Client, repo: Any) -> None:
    root = Path(repo.path)

    def dirty() -> set[tuple[str, str]]:
        files = api.get(f"/api/projects/{repo.pk}/git").json()["files"]
        return {(f["path"], f["index"] + f["worktree"]) for f in files}

    assert dirty() == set()
    (root / "b.txt").write_text("bee\n")  # the same bytes again: not a change
    assert dirty() == set()
    (root / "b.txt").write_text("BEE\n")
    assert dirty() == {("b.txt", " M")}
    (root / "b.txt").write_text("bee\n")
    assert dirty() == set()
    (root / "a.txt").chmod(0o755)
    assert dirty() == {("a.txt", " M")}
