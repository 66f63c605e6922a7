"""API shapes for changes, rewind and restore, and the project's files (docs/workspace.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from ninja import Field, Schema
from pydantic import StringConstraints

ClientId = Annotated[str, StringConstraints(min_length=1, max_length=100)]


class FileChangeOut(Schema):
    path: str
    status: Literal["added", "modified", "deleted"]
    additions: int
    deletions: int
    binary: bool
    diff: str | None = Field(description="The unified diff; null for a binary file or past the size limit.")
    truncated: bool


class ChangesOut(Schema):
    run_id: int | None = Field(description="The run (for a session: its last run).")
    complete: bool = Field(description="False while the run is active, or when it never ended (to now).")
    files: list[FileChangeOut]
    notice: str | None = Field(None, description="Why there is nothing to show: checkpoints are off.")


class TurnSummaryOut(Schema):
    run_id: int
    files: int = Field(description="Files the turn changed (0: none).")
    additions: int
    deletions: int


class ChangesSummaryOut(Schema):
    runs: list[TurnSummaryOut] = Field(
        description="The settled turns asked for (all, newest first, at most 500) that have both checkpoints."
    )


class RewindIn(Schema):
    client_id: ClientId
    force: bool = Field(False, description="Overwrite files that changed since the session's last turn.")
    dry_run: bool = Field(False, description="Answer `preview`: what would be restored and what conflicts.")


class RestoredOut(Schema):
    status: Literal["accepted", "duplicate", "preview"]
    restored: list[str]
    undo: int = Field(
        description="The checkpoint of the tree this replaced: restore it to undo (0 for a preview)."
    )
    conflicts: list[str] = Field(
        default_factory=list, description="A preview's paths changed since the session's last turn."
    )


class FileEntryOut(Schema):
    name: str
    path: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    modified: datetime


class FileListOut(Schema):
    path: str
    entries: list[FileEntryOut]
    truncated: bool


class FileSavedOut(Schema):
    path: str
    etag: str
    size: int


class PathMatchOut(Schema):
    path: str
    type: Literal["file", "dir", "symlink"]


class PathSearchOut(Schema):
    query: str
    matches: list[PathMatchOut]
    truncated: bool = Field(description="The walk stopped at its cap: a deeper match may exist.")


class DirtyFileOut(Schema):
    path: str
    index: str = Field(description="git's status column for the index (' ', M, A, D, ?, …).")
    worktree: str = Field(description="git's status column for the working tree.")


class GitStateOut(Schema):
    repository: bool = Field(description="False when the project's top holds no .git directory.")
    branch: str | None = Field(description="null: a detached HEAD (or not a repository).")
    head: str | None = Field(description="The commit HEAD names; null before the first commit.")
    files: list[DirtyFileOut]
    truncated: bool


class CommitIn(Schema):
    client_id: ClientId
    message: Annotated[str, StringConstraints(min_length=1, max_length=20_000, strip_whitespace=True)]
    paths: list[Annotated[str, StringConstraints(min_length=1, max_length=4096)]] = Field(
        max_length=1000, description="The project-relative files to commit, as they are on disk."
    )


class CommittedOut(Schema):
    status: Literal["committed", "duplicate"]
    commit: str
    branch: str | None
    paths: list[str]
