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


class RewindIn(Schema):
    client_id: ClientId
    force: bool = Field(False, description="Overwrite files that changed since the session's last turn.")


class RestoredOut(Schema):
    status: Literal["accepted", "duplicate"]
    restored: list[str]
    undo: int = Field(description="The checkpoint of the tree this replaced: restore it to undo.")


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
