"""Which tree a session works in — the one answer every hook asks (docs/worktrees.md).

`session_tree` for the web side (files, changes); `turn_tree`, `prepare_tree` and `record_tree`
for the runner before a turn (it makes a pending worktree, checks a ready one, and refuses rather
than fall back to the main checkout); `agent_tree` for the pool: what a worktree agent's sandbox
binds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from projects.refusals import Refused
from worktrees import git
from worktrees.models import Worktree, WorktreeState


class WorktreeUnavailable(Refused):
    """The session's worktree cannot be made or used: the turn fails, nothing runs elsewhere."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(409, code, message)


@dataclass(frozen=True)
class SessionTree:
    path: str  # where the session's agent works, its files and changes are
    worktree_id: int | None = None  # None: the project's own checkout


@dataclass(frozen=True)
class AgentTree:
    """A worktree agent's binds: the worktree writable, and of the main repository's git
    directory exactly what committing on its branch writes (objects, refs, logs, its own
    `.git/worktrees/<name>`); the rest of that directory read-only; the main checkout unbound."""

    path: Path
    project: Path
    git_common: Path
    git_writable: tuple[Path, ...]


def session_tree(session_id: int, project_path: str) -> SessionTree:
    row = Worktree.objects.filter(session_id=session_id).values_list("pk", "path", "state").first()
    if row is None:
        return SessionTree(project_path)
    pk, path, _ = row
    return SessionTree(path, pk)


def turn_tree(session_id: int) -> Worktree | None:
    """The runner, before a turn: the session's worktree row (None: it works in the main checkout).

    Raises WorktreeUnavailable for a discarded one: its turns never run anywhere else.
    """
    row = Worktree.objects.filter(session_id=session_id).first()
    if row is not None and row.state == WorktreeState.DISCARDED:
        raise WorktreeUnavailable(
            "worktree_discarded", f"This session's worktree (branch {row.branch}) was discarded."
        )
    return row


def prepare_tree(row: Worktree) -> str:
    """git only (off the database's thread): make the worktree if it is not ready; why it is
    unusable, or "". Safe to repeat: a runner that died halfway finds it made."""
    try:
        if row.state != WorktreeState.READY:
            _make(row)
        return _problem(row)
    except (git.GitFailed, OSError) as exc:
        return str(exc)


def record_tree(row: Worktree, problem: str) -> None:
    """The runner's finding recorded; raises WorktreeUnavailable when the turn must fail."""
    if problem:
        Worktree.objects.filter(pk=row.pk).update(error=problem)
        raise WorktreeUnavailable(
            "worktree_unavailable",
            f"This session's worktree at {row.path} cannot be used ({problem}); "
            "the turn did not run in the main checkout.",
        )
    live = (WorktreeState.PENDING, WorktreeState.READY, WorktreeState.ARCHIVED)
    Worktree.objects.filter(pk=row.pk, state__in=live).update(state=WorktreeState.READY, error="")


def _make(row: Worktree) -> None:
    path = Path(row.path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and _problem(row) == "":
        return  # made by a runner that died before it could say so
    if git.branch_exists(row.repository, row.branch):  # restored after archiving: the branch as it is
        git.run(row.repository, "worktree", "add", "--quiet", str(path), row.branch)
    else:
        argv = ["worktree", "add", "--quiet", "-b", row.branch, str(path), row.base_commit]
        git.run(row.repository, *argv)


def _problem(row: Worktree) -> str:
    """Why the worktree is unusable, or ""."""
    path = Path(row.path)
    if not path.is_dir() or path.is_symlink():
        return "its directory is missing"
    if not (path / ".git").is_file():
        return "its .git file is missing"
    if git.toplevel(path) is None:
        return "git does not recognise it"
    if git.common_dir(path) != git.common_dir(row.repository):
        return "it belongs to another repository"
    branch = git.current_branch(path)
    if branch != row.branch:
        return f"it has {branch or 'a detached HEAD'} checked out, not {row.branch}"
    return ""


def agent_tree(project_id: int, cwd: str) -> AgentTree | None:
    """For the pool: `cwd` as one of the project's ready worktrees, with its binds; else None."""
    row = (
        Worktree.objects.filter(session__project_id=project_id, path=cwd, state=WorktreeState.READY)
        .values_list("path", "repository")
        .first()
    )
    if row is None:
        return None
    path, repository = Path(row[0]), Path(row[1])
    common = git.common_dir(path)
    (common / "logs").mkdir(exist_ok=True)  # a commit's reflog goes there: made now, bound writable
    writable = [common / "objects", common / "refs", common / "logs", git.git_dir(path)]
    return AgentTree(path, repository, common, tuple(p for p in writable if p.is_dir()))
