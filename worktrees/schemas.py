"""API shapes for worktree sessions: the summary a session shows, merge and discard."""

from __future__ import annotations

from typing import Annotated, Literal

from ninja import Field, Schema
from pydantic import StringConstraints

BranchName = Annotated[str, StringConstraints(strip_whitespace=True, max_length=200)]
ClientId = Annotated[str, StringConstraints(min_length=1, max_length=100)]


class WorktreeOut(Schema):
    branch: str
    base: str = Field(description="The branch it merges back into.")
    state: str = Field(description="pending (made before the first turn), ready, archived or discarded.")
    ahead: int = Field(description="Commits on the branch the base lacks.")
    behind: int = Field(description="Commits on the base the branch lacks.")
    dirty: bool = Field(description="The worktree has uncommitted changes.")
    error: str = Field(description='Why the runner could not make or use it, last time ("" if it could).')


class MergeIn(Schema):
    strategy: Literal["merge", "squash", "rebase"] = "merge"
    message: Annotated[str, StringConstraints(max_length=10_000)] = Field(
        "", description="The commit message of the uncommitted work and of a merge or squash commit."
    )
    client_id: ClientId = Field(description="Idempotency key: the same one answers the same merge.")


class MergeOut(Schema):
    status: Literal["merged"]
    commit: str = Field(description="The base's new tip.")
    duplicate: bool = Field(False, description="This client_id merged before; nothing was done again.")


class DiscardQuery(Schema):
    delete_branch: bool = Field(False, description="Drop the branch too (its commits become unreachable).")


class DiscardOut(Schema):
    status: Literal["discarded"]
    branch_deleted: bool
