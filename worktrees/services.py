"""Worktree sessions: asked for with the session, merged back, discarded (docs/worktrees.md).

The web records the intent and checks what it can without touching a checkout (is it a git
repository, is the branch name valid and free, does the base exist); the runner does the git
work of making the worktree (worktrees/trees.py). A merge or a discard runs under the session's
lock, refused while a run is active, so no turn starts in a tree being changed.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import transaction

from projects import services as project_services
from projects.models import Project, Session
from projects.refusals import Refused
from runs.models import Run
from worktrees import conf, git, merging
from worktrees.models import Worktree, WorktreeMerge, WorktreeState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Summary:
    branch: str
    base: str
    state: str
    ahead: int
    behind: int
    dirty: bool
    error: str


@dataclass(frozen=True)
class Merged:
    status: str  # "merged"
    commit: str
    duplicate: bool = False


@dataclass(frozen=True)
class Discarded:
    status: str  # "discarded"
    branch_deleted: bool


def do_create_worktree_session(project: Project, *, title: str, branch: str, base: str) -> Session:
    """A session that will work in its own worktree on a new branch from `base`.

    Preconditions, refused before anything is written: the project's directory is the top of a
    git checkout (422 `not_a_git_repository`); `base` (default: the checkout's current branch)
    is a branch (422 `invalid_base`); `branch` (default: `hermesweb/session-<n>`) is a valid
    name (422 `invalid_branch`) that neither the repository nor another worktree session has
    (409 `branch_exists`). The runner makes the worktree before the first turn.
    """
    repo = git.toplevel(project.path)
    if repo is None:
        raise Refused(
            422, "not_a_git_repository", "The project's directory is not the top of a git repository."
        )
    base = base or git.current_branch(repo) or ""
    base_commit = git.rev(repo, f"refs/heads/{base}") if base and git.valid_branch_name(base) else None
    if base_commit is None:
        raise Refused(422, "invalid_base", f"The base {base or '(detached HEAD)'!r} is not a branch here.")
    root = conf.root()
    if not conf.outside_roots(root) or root.is_relative_to(repo):
        raise Refused(409, "worktree_root_refused", "HERMESWEB_WORKTREE_ROOT lies inside an allowed root.")
    with transaction.atomic():
        session = project_services.do_create_session(project, title=title)
        name = branch or f"hermesweb/session-{session.pk}"
        if not git.valid_branch_name(name) or len(name) > 200:
            raise Refused(
                422, "invalid_branch", f"{name!r} is not a valid branch name (git check-ref-format)."
            )
        taken = Worktree.objects.filter(session__project__path=project.path, branch=name).exclude(
            state=WorktreeState.DISCARDED
        )
        if git.branch_exists(repo, name) or taken.exists():
            raise Refused(409, "branch_exists", f"The branch {name!r} exists already.", {"branch": name})
        Worktree.objects.create(
            session=session,
            branch=name,
            base=base,
            base_commit=base_commit,
            path=str(root / f"project-{project.pk}" / f"session-{session.pk}-{uuid.uuid4().hex[:8]}"),
            repository=str(repo),
        )
    return session


def summary(session: Any) -> Summary | None:
    """What `GET /api/sessions/{id}` shows of the session's worktree; None when it has none."""
    row = Worktree.objects.filter(session_id=session.pk).first()
    if row is None:
        return None
    ahead = behind = 0
    dirty = False
    try:
        if git.branch_exists(row.repository, row.branch):
            ahead, behind = git.ahead_behind(row.repository, row.branch, row.base)
        if row.state == WorktreeState.READY and Path(row.path).is_dir():
            dirty = bool(git.status(row.path))
    except (git.GitFailed, OSError) as exc:
        log.warning("worktree %s: %s", row.pk, exc)
    return Summary(row.branch, row.base, row.state, ahead, behind, dirty, row.error)


def _author(user: Any) -> merging.Author:
    name = (user.get_full_name() or user.get_username()).strip() or "hermesweb user"
    return merging.Author(name, user.email or f"{user.get_username()}@hermesweb.invalid")


def _locked(user: Any, session_id: int) -> tuple[Session, Worktree]:
    session = Session.objects.lock(session_id, visible_to=user)
    row = Worktree.objects.filter(session=session).first()
    if row is None:
        raise Refused(409, "no_worktree", "This session has no worktree.")
    return session, row


def _refuse_busy(session: Session) -> None:
    if Run.objects.filter(session=session).active().exists():
        raise Refused(
            409, "session_busy", "A turn is running in this session; merge or discard after it ends."
        )


def do_merge(user: Any, session_id: int, *, strategy: str, message: str, client_id: str) -> Merged:
    """Commit the worktree's uncommitted work (author: the user), bring its branch into its base.

    Preconditions: the session has a ready worktree (409 `no_worktree`, `worktree_not_ready`), no
    active run (409 `session_busy`). Refusals leave both checkouts and both branches exactly as
    they were: 409 `merge_conflict` (details: the paths), 409 `base_dirty` (the main checkout has
    uncommitted changes to files the merge touches). The same `client_id` answers the same commit.
    """
    with transaction.atomic():
        session, row = _locked(user, session_id)
        done = WorktreeMerge.objects.filter(worktree=row, client_id=client_id).first()
        if done is not None:
            return Merged("merged", done.commit, duplicate=True)
        _refuse_busy(session)
        if row.state != WorktreeState.READY or not Path(row.path).is_dir():
            raise Refused(409, "worktree_not_ready", "The worktree is not there (yet): nothing to merge.")
        plan = merging.Plan(
            Path(row.repository), Path(row.path), row.branch, row.base, strategy, message, _author(user)
        )
        try:
            commit = merging.merge(plan)
        except merging.MergeConflict as exc:
            raise Refused(
                409,
                "merge_conflict",
                f"Merging {row.branch} into {row.base} conflicts; nothing was changed.",
                {"paths": exc.paths},
            ) from None
        except merging.BaseDirty as exc:
            raise Refused(
                409,
                "base_dirty",
                "The main checkout has uncommitted changes the merge would overwrite; nothing changed.",
                {"paths": exc.paths},
            ) from None
        except git.GitFailed as exc:
            raise Refused(409, "merge_failed", f"git refused the merge: {exc}") from None
        WorktreeMerge.objects.create(worktree=row, client_id=client_id, strategy=strategy, commit=commit)
    return Merged("merged", commit)


def do_discard(user: Any, session_id: int, *, delete_branch: bool) -> Discarded:
    """Remove the session's worktree (its uncommitted work with it), and its branch if asked.

    Preconditions: the session has a worktree (409 `no_worktree`) and no active run (409
    `session_busy`). Safe to repeat. The session's later turns fail (`worktree_discarded`).
    """
    with transaction.atomic():
        session, row = _locked(user, session_id)
        _refuse_busy(session)
        remove_tree(row)
        deleted = False
        if delete_branch and git.branch_exists(row.repository, row.branch):
            git.run(row.repository, "branch", "--quiet", "-D", row.branch)
            deleted = True
        Worktree.objects.filter(pk=row.pk).update(state=WorktreeState.DISCARDED, error="")
    return Discarded("discarded", deleted)


def remove_tree(row: Worktree) -> None:
    """The worktree's directory and git's record of it gone; the branch stays."""
    path = Path(row.path)
    if Path(row.repository).is_dir():
        git.run(row.repository, "worktree", "remove", "--force", str(path), check=False)
    shutil.rmtree(path, ignore_errors=True)
    if Path(row.repository).is_dir():
        git.run(row.repository, "worktree", "prune", check=False)
