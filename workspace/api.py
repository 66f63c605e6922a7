"""The workspace's routes: a run's and a session's changes, rewind and restore, the project's files.

Design note: docs/workspace.md. Every object is looked up among the caller's own (`visible_to`),
and every path inside a project opened without following a symlink (workspace/fs.py): someone
else's project, a missing path and one that escapes get the same 404.
"""

from __future__ import annotations

import mimetypes
from pathlib import PurePosixPath
from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import Query, Router, Schema

from hermesweb.auth import get_visible
from hermesweb.errors import MAX_ID, not_found
from projects.models import Project, Session
from runs.models import Run
from workspace import fs, services
from workspace.models import Checkpoint
from workspace.schemas import ChangesOut, FileEntryOut, FileListOut, FileSavedOut, RestoredOut, RewindIn

router = Router()

# Served inline: images a browser renders without running anything (never SVG: it holds scripts).
INLINE_IMAGES = {"image/png", "image/jpeg", "image/gif", "image/webp", "image/avif"}


def changes_out(changes: services.Changes) -> ChangesOut:
    return ChangesOut(
        run_id=changes.run_id,
        complete=changes.complete,
        files=[vars(f) for f in changes.files],
        notice=changes.notice or None,
    )


@router.get("/runs/{id}/changes", response=ChangesOut, tags=["workspace"])
def run_changes(request: HttpRequest, id: int) -> ChangesOut:
    """The project's files from the run's start to its end; to now (`complete: false`) while it
    runs or when it never ended. 409 `checkpoints_off` / `checkpoint_unavailable`."""
    run = get_visible(Run.objects.select_related("session__project"), request.auth, id, "run")
    return changes_out(services.run_changes(run))


@router.get("/sessions/{id}/changes", response=ChangesOut, tags=["workspace"])
def session_changes(request: HttpRequest, id: int) -> ChangesOut:
    """The project's files from before the session's first turn to the end of its last."""
    session = get_visible(Session.objects.select_related("project"), request.auth, id, "session")
    return changes_out(services.session_changes(session))


@router.post("/runs/{id}/rewind", response=RestoredOut, tags=["workspace"])
def rewind_run(request: HttpRequest, id: int, payload: RewindIn) -> services.Restored:
    """Every file the session changed from this run on, back to its bytes before it.

    409 `session_busy` while a turn of the session is active; 409 `rewind_conflict` (details:
    `paths`) when a file changed since the session's last turn, nothing touched, unless `force`;
    409 `no_checkpoint`. `undo` is the checkpoint to restore to undo it. Idempotent by `client_id`.
    """
    if not 1 <= id <= MAX_ID:
        raise not_found("run")
    try:
        return services.do_rewind(request.auth, id, payload.client_id, payload.force)
    except Run.DoesNotExist:
        raise not_found("run") from None


@router.post("/checkpoints/{id}/restore", response=RestoredOut, tags=["workspace"])
def restore_checkpoint(request: HttpRequest, id: int, payload: RewindIn) -> services.Restored:
    """Put the files back to this checkpoint's tree: for a rewind's `undo`, what the rewind
    replaced. The same rules and answers as the rewind."""
    if not 1 <= id <= MAX_ID:
        raise not_found("checkpoint")
    try:
        return services.do_restore(request.auth, id, payload.client_id, payload.force)
    except Checkpoint.DoesNotExist:
        raise not_found("checkpoint") from None


# ---------------------------------------------------------------- files


class PathQuery(Schema):
    path: str = ""


def _project(request: HttpRequest, id: int) -> Project:
    return get_visible(Project.objects, request.auth, id, "project")


@router.get("/projects/{id}/files", response=FileListOut, tags=["workspace"])
def list_files(request: HttpRequest, id: int, query: Query[PathQuery]) -> FileListOut:
    """A directory of the project (`path` relative to it; empty: its top): directories first,
    at most 1,000 entries. 404 for any path outside the project or through a symlink."""
    project = _project(request, id)
    try:
        path, entries, truncated = services.list_files(project, query.path)
    except (fs.Outside, OSError):
        raise not_found("path") from None
    return FileListOut(path=path, entries=[FileEntryOut(**vars(e)) for e in entries], truncated=truncated)


# Answers particular to a file's bytes, besides those every operation of its shape documents.
TOO_LARGE = {413: {"description": "The file is larger than the files API serves (`file_too_large`)."}}
PRECONDITIONS = {
    412: {"description": "The file changed since it was read, or exists already (`stale_file`)."},
    428: {"description": "Neither `If-Match` nor `If-None-Match: *` was sent (`precondition_required`)."},
}


@router.get(
    "/projects/{id}/files/content",
    tags=["workspace"],
    response={200: None},
    openapi_extra={"responses": TOO_LARGE},
)
def file_content(request: HttpRequest, id: int, query: Query[PathQuery]) -> HttpResponse:
    """The file's bytes with its `ETag`: text as text/plain, images inline, anything else as a
    download; never run by the browser (nosniff, a sandbox CSP)."""
    project = _project(request, id)
    try:
        data, etag = services.read_file(project, query.path)
    except (fs.Outside, OSError):
        raise not_found("path") from None
    name = PurePosixPath(query.path).name
    guessed = mimetypes.guess_type(name)[0] or ""
    if guessed in INLINE_IMAGES:
        response = HttpResponse(data, content_type=guessed)
    elif _is_text(data):
        response = HttpResponse(data, content_type="text/plain; charset=utf-8")
    else:
        response = HttpResponse(data, content_type="application/octet-stream")
        response["Content-Disposition"] = f"attachment; filename*=UTF-8''{_quote(name)}"
    response["ETag"] = etag
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    response["Cache-Control"] = "private, no-cache"
    return response


@router.put(
    "/projects/{id}/files/content",
    tags=["workspace"],
    response=FileSavedOut,
    openapi_extra={"responses": {**TOO_LARGE, **PRECONDITIONS}},
)
def save_file(request: HttpRequest, id: int, query: Query[PathQuery]) -> Any:
    """Save the request's body as the file. `If-Match: <etag>` (412 `stale_file` when the file
    changed since), or `If-None-Match: *` to create one; neither: 428 `precondition_required`."""
    project = _project(request, id)
    try:
        etag = services.do_write_file(
            project,
            query.path,
            request.body,
            if_match=request.headers.get("If-Match"),
            if_none_match=request.headers.get("If-None-Match"),
        )
    except (fs.Outside, OSError):
        raise not_found("path") from None
    response = HttpResponse(
        FileSavedOut(path=query.path, etag=etag, size=len(request.body)).model_dump_json(),
        content_type="application/json",
    )
    response["ETag"] = etag
    return response


def _is_text(data: bytes) -> bool:
    if b"\x00" in data[:8192]:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _quote(name: str) -> str:
    from urllib.parse import quote

    return quote(name, safe="")
