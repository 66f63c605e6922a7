"""The workspace's routes: a run's and a session's changes, rewind and restore, the project's files.

Design note: docs/workspace.md. Every object is looked up among the caller's own (`visible_to`),
and every path inside a project opened without following a symlink (workspace/fs.py): someone
else's project, a missing path and one that escapes get the same 404.
"""

from __future__ import annotations

import copy
import mimetypes
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from django.http import HttpRequest, HttpResponse
from ninja import Field, Query, Router, Schema

from hermesweb.auth import get_visible
from hermesweb.errors import MAX_ID, not_found
from projects.models import Project, Session
from projects.refusals import Refused
from runs.models import Run
from workspace import context, fs, git, search, services
from workspace.models import Checkpoint
from workspace.schemas import (
    ChangesOut,
    ChangesSummaryOut,
    CommitIn,
    CommittedOut,
    FileEntryOut,
    FileListOut,
    FileSavedOut,
    GitStateOut,
    PathSearchOut,
    RestoredOut,
    RewindIn,
    TurnSummaryOut,
)
from worktrees.models import Worktree

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


class RunsQuery(Schema):
    runs: str = Field("", description="Comma-separated run ids; empty: the session's newest 500.")


@router.get("/sessions/{id}/changes/summary", response=ChangesSummaryOut, tags=["workspace"])
def changes_summary(request: HttpRequest, id: int, query: Query[RunsQuery]) -> ChangesSummaryOut:
    """Per settled turn: files changed, lines added and deleted — one request for a page of
    turns. 422 `invalid_runs` when `runs` is not a list of ids."""
    session = get_visible(Session.objects.select_related("project"), request.auth, id, "session")
    ids: list[int] | None = None
    if query.runs.strip():
        parts = [p.strip() for p in query.runs.split(",") if p.strip()]
        if len(parts) > services.SUMMARY_MAX_RUNS or not all(p.isdigit() and len(p) < 19 for p in parts):
            raise services.Refused(422, "invalid_runs", "runs: at most 500 comma-separated run ids.")
        ids = [int(p) for p in parts]
    return ChangesSummaryOut(runs=[TurnSummaryOut(**vars(s)) for s in services.turn_summaries(session, ids)])


class LinesQuery(Schema):
    path: str
    start: int = Field(1, ge=1, le=10_000_000, description="The first line, 1-based.")
    count: int = Field(200, ge=1, le=context.MAX_LINES, description="How many lines, at most 2,000.")


class LinesOut(Schema):
    path: str
    start: int
    lines: list[str]
    total: int = Field(description="The file's line count on the changes' newer side.")


# Answers of the lines routes besides those every GET documents.
LINES_ANSWERS = {
    409: {"description": "No checkpoints to read from (`checkpoints_off`, `checkpoint_unavailable`)."},
    413: {"description": "The file is larger than the files API serves (`file_too_large`)."},
}


@router.get(
    "/runs/{id}/changes/lines",
    response=LinesOut,
    tags=["workspace"],
    openapi_extra={"responses": LINES_ANSWERS},
)
def run_changes_lines(request: HttpRequest, id: int, query: Query[LinesQuery]) -> context.Lines:
    """Lines of one changed file as the run left it: a fold between hunks, opened. 404 for a path
    that is not a file there; 409 `checkpoints_off` / `checkpoint_unavailable`."""
    run = get_visible(Run.objects.select_related("session__project"), request.auth, id, "run")
    try:
        return context.run_lines(run, query.path, query.start, query.count)
    except (fs.Outside, OSError):
        raise not_found("path") from None


@router.get(
    "/sessions/{id}/changes/lines",
    response=LinesOut,
    tags=["workspace"],
    openapi_extra={"responses": LINES_ANSWERS},
)
def session_changes_lines(request: HttpRequest, id: int, query: Query[LinesQuery]) -> context.Lines:
    """Lines of one changed file as the session's changes show it (after its last turn)."""
    session = get_visible(Session.objects.select_related("project"), request.auth, id, "session")
    try:
        return context.session_lines(session, query.path, query.start, query.count)
    except (fs.Outside, OSError):
        raise not_found("path") from None


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
        return services.do_rewind(request.auth, id, payload.client_id, payload.force, payload.dry_run)
    except Run.DoesNotExist:
        raise not_found("run") from None


@router.post("/checkpoints/{id}/restore", response=RestoredOut, tags=["workspace"])
def restore_checkpoint(request: HttpRequest, id: int, payload: RewindIn) -> services.Restored:
    """Put the files back to this checkpoint's tree: for a rewind's `undo`, what the rewind
    replaced. The same rules and answers as the rewind."""
    if not 1 <= id <= MAX_ID:
        raise not_found("checkpoint")
    try:
        return services.do_restore(request.auth, id, payload.client_id, payload.force, payload.dry_run)
    except Checkpoint.DoesNotExist:
        raise not_found("checkpoint") from None


# ---------------------------------------------------------------- files


class SessionQuery(Schema):
    session: int | None = Field(
        None, description="A session of this project: its tree (its own worktree, if it has one)."
    )


class PathQuery(SessionQuery):
    path: str = ""


def _project(request: HttpRequest, id: int) -> Project:
    return get_visible(Project.objects, request.auth, id, "project")


class TreeListOut(FileListOut):
    root: str = Field(description="The tree listed, absolute: the project's, or the session's worktree.")


@dataclass(frozen=True)
class Tree:
    project: Project  # an unsaved copy whose `path` is the tree's: services read only that
    path: str
    git_dir: str | None  # a worktree's own git directory; None: the project's `.git`


def _tree(request: HttpRequest, id: int, session_id: int | None) -> Tree:
    """The project's checkout, or with `session` that session's (its worktree, docs/worktrees.md).
    Someone else's session, or one of another project, is a 404 like a missing one."""
    project = _project(request, id)
    if session_id is None:
        return Tree(project, project.path, None)
    if not 1 <= session_id <= MAX_ID:
        raise not_found("session")
    session = get_visible(Session.objects, request.auth, session_id, "session")
    if session.project_id != project.pk:
        raise not_found("session")
    row = Worktree.objects.filter(session_id=session.pk).values_list("path", "repository").first()
    if row is None:
        return Tree(project, project.path, None)
    path, repository = row
    seen = copy.copy(project)
    seen.path = path
    try:
        git_dir = git.worktree_git_dir(path, repository)
    except fs.Outside:
        git_dir = None  # not made yet, or broken: its files answer 404, its git state says so
    return Tree(seen, path, git_dir or "/nonexistent")


@router.get("/projects/{id}/files", response=TreeListOut, tags=["workspace"])
def list_files(request: HttpRequest, id: int, query: Query[PathQuery]) -> TreeListOut:
    """A directory of the project (`path` relative to it; empty: its top): directories first,
    at most 1,000 entries. 404 for any path outside the project or through a symlink. With
    `session`: of that session's tree (`root`)."""
    tree = _tree(request, id, query.session)
    try:
        path, entries, truncated = services.list_files(tree.project, query.path)
    except (fs.Outside, OSError):
        raise not_found("path") from None
    return TreeListOut(
        path=path, entries=[FileEntryOut(**vars(e)) for e in entries], truncated=truncated, root=tree.path
    )


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
    project = _tree(request, id, query.session).project
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
    project = _tree(request, id, query.session).project
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


class SearchQuery(SessionQuery):
    q: str = ""


@router.get("/projects/{id}/files/search", response=PathSearchOut, tags=["workspace"])
def search_files(request: HttpRequest, id: int, query: Query[SearchQuery]) -> PathSearchOut:
    """The project's files and folders whose path holds `q`'s letters in order, best first (at
    most 50): the composer's `@`. Symlinks named, never entered; .git and dependency or build
    directories skipped; the walk is capped (`truncated`)."""
    project = _tree(request, id, query.session).project
    try:
        found = search.search_paths(project, query.q)
    except (fs.Outside, OSError):
        raise not_found("project") from None
    return PathSearchOut(query=query.q, matches=[vars(m) for m in found.matches], truncated=found.truncated)


@router.get("/projects/{id}/git", response=GitStateOut, tags=["workspace"])
def git_state(request: HttpRequest, id: int, query: Query[SessionQuery]) -> git.GitState:
    """The project's own repository: its branch, HEAD and dirty files (`repository: false` when
    its top holds no .git directory). Git runs with hooks and fsmonitor off (docs/workspace.md).
    With `session`: that session's worktree, its branch and its dirty files."""
    tree = _tree(request, id, query.session)
    try:
        return git.git_state(tree.project, tree.path, tree.git_dir)
    except (fs.Outside, OSError):
        raise not_found("project") from None
    except git.GitError as exc:
        raise Refused(409, "git_failed", str(exc)) from None


@router.post("/projects/{id}/git/commit", response=CommittedOut, tags=["workspace"])
def git_commit(request: HttpRequest, id: int, payload: CommitIn, query: Query[SessionQuery]) -> git.Committed:
    """Commit the ticked files as they are on disk, author the user; no push. 409 `not_git_repo`
    / `nothing_to_commit` / `git_busy`, 422 `path_outside` / `not_a_file`. Idempotent by
    `client_id`. With `session`: in that session's worktree, on its branch."""
    tree = _tree(request, id, query.session)
    try:
        return git.do_commit(
            request.auth,
            tree.project,
            message=payload.message,
            paths=payload.paths,
            client_id=payload.client_id,
            tree=tree.path,
            git_dir=tree.git_dir,
        )
    except (fs.Outside, OSError):
        raise not_found("project") from None
    except git.GitError as exc:
        raise Refused(409, "git_failed", str(exc)) from None


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
