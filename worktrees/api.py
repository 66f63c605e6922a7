"""Merge a worktree session's branch back, or discard its worktree. Thin: parse, authorize, act."""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Query, Router

from hermesweb.auth import get_visible
from projects.models import Session
from worktrees import services
from worktrees.schemas import DiscardOut, DiscardQuery, MergeIn, MergeOut

router = Router()


@router.post("/sessions/{id}/worktree/merge", response=MergeOut, tags=["worktrees"])
def merge_worktree(request: HttpRequest, id: int, payload: MergeIn) -> MergeOut:
    """Commit the worktree's uncommitted work (author: you) and bring its branch into its base.

    409 `merge_conflict` (`details.paths`), `base_dirty` (`details.paths`: uncommitted in the
    main checkout), `session_busy`, `no_worktree`, `worktree_not_ready`: each leaves both
    checkouts and both branches exactly as they were. The same `client_id` answers the same commit.
    """
    session = get_visible(Session.objects, request.auth, id, "session")
    done = services.do_merge(
        request.auth,
        session.pk,
        strategy=payload.strategy,
        message=payload.message,
        client_id=payload.client_id,
    )
    return MergeOut(status="merged", commit=done.commit, duplicate=done.duplicate)


@router.delete("/sessions/{id}/worktree", response=DiscardOut, tags=["worktrees"])
def discard_worktree(request: HttpRequest, id: int, query: Query[DiscardQuery]) -> DiscardOut:
    """Remove the session's worktree with its uncommitted work; `delete_branch=true` drops the
    branch too. 409 `session_busy`, `no_worktree`. Safe to repeat; the session's later turns fail."""
    session = get_visible(Session.objects, request.auth, id, "session")
    done = services.do_discard(request.auth, session.pk, delete_branch=query.delete_branch)
    return DiscardOut(status=done.status, branch_deleted=done.branch_deleted)
