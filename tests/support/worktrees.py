"""Helpers for the worktree tests: a real git repository as the project, sessions in worktrees."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

from django.test import Client

from projects.models import Session
from worktrees import trees
from worktrees.models import Worktree

IDENT = {
    "GIT_AUTHOR_NAME": "Tester",
    "GIT_AUTHOR_EMAIL": "tester@example.com",
    "GIT_COMMITTER_NAME": "Tester",
    "GIT_COMMITTER_EMAIL": "tester@example.com",
}


def git(cwd: str | Path, *argv: str) -> str:
    import os

    done = subprocess.run(
        ["git", "-c", "safe.directory=*", *argv],
        cwd=str(cwd),
        env={**os.environ, **IDENT},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip("\n")


def make_repo(path: str | Path, files: dict[str, str] | None = None) -> Path:
    """`path` as a git repository on `main` with one commit of `files`."""
    repo = Path(path)
    git(repo, "init", "--quiet", "--initial-branch=main")
    for name, text in (files or {"shared.txt": "one\ntwo\nthree\n"}).items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "--all")
    git(repo, "commit", "--quiet", "-m", "initial")
    return repo


def create_session(api: Client, project_id: int, **body: Any) -> Any:
    return api.post(
        f"/api/projects/{project_id}/sessions", {"worktree": True, **body}, content_type="application/json"
    )


def made(session_id: int) -> Path:
    """What the runner does before the session's first turn, done here: the worktree made."""
    row = trees.turn_tree(session_id)
    assert row is not None
    trees.record_tree(row, trees.prepare_tree(row))
    return Path(Worktree.objects.get(session_id=session_id).path)


def merge(api: Client, session: Session | int, strategy: str = "merge", **body: Any) -> Any:
    sid = session if isinstance(session, int) else session.pk
    payload = {"strategy": strategy, "message": "", "client_id": uuid.uuid4().hex, **body}
    return api.post(f"/api/sessions/{sid}/worktree/merge", payload, content_type="application/json")


def state(repo: Path) -> tuple[str, str, str]:
    """All refs, the index and the working files' status: what "exactly as before" compares."""
    refs = git(repo, "for-each-ref", "--format=%(refname) %(objectname)")
    return refs, git(repo, "ls-files", "--stage"), git(repo, "status", "--porcelain", "--untracked-files=all")
