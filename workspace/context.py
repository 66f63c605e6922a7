"""Unchanged lines for a changes view's folds: a file's lines as the changes' newer side has them.

Design note: docs/workspace.md ("Changes"). A unified diff holds only a few lines around each
change; the view folds the lines between hunks and opens a fold by asking for them here. They
are unchanged, so the newer side is the one to read: the run's end checkpoint (a session's last
one) or, while a turn runs or when it never ended, the file in the session's tree now. Bounded:
at most MAX_LINES lines of a file no larger than the files API serves.
"""

from __future__ import annotations

from dataclasses import dataclass

from projects.models import Session
from projects.refusals import Refused
from runs.models import Run
from workspace import conf, fs, services
from workspace.models import Checkpoint, CheckpointKind
from workspace.store import Store, StoreError
from worktrees.trees import session_tree

MAX_LINES = 2_000


@dataclass(frozen=True)
class Lines:
    path: str
    start: int  # the first line's number, 1-based
    lines: list[str]
    total: int  # the file's line count on that side


def run_lines(run: Run, path: str, start: int, count: int) -> Lines:
    """Lines `start`.. of `path` as `run` left it (its end checkpoint; now, while it runs).

    Preconditions: `run` is the caller's. 404-worthy fs.Outside for a path that is not a file
    there; 409 `checkpoints_off` when the run has no checkpoint.
    """
    end = Checkpoint.objects.of_run(run.pk, CheckpointKind.END)
    if Checkpoint.objects.of_run(run.pk, CheckpointKind.START) is None:
        raise Refused(409, "checkpoints_off", "This turn has no checkpoints to read lines from.")
    return _lines(run.session, end.tree if end is not None else None, path, start, count)


def session_lines(session: Session, path: str, start: int, count: int) -> Lines:
    """Lines of `path` as the session's changes show it: after its last checkpoint, or now while
    a turn runs (the same newer side as `services.session_changes`)."""
    latest = Checkpoint.objects.latest_of_session(session.pk)
    if latest is None:
        raise Refused(409, "checkpoints_off", "This session has no checkpoints to read lines from.")
    busy = session.runs.active().exists()  # type: ignore[attr-defined]
    settled = not busy and latest.kind != CheckpointKind.START
    return _lines(session, latest.after_tree if settled else None, path, start, count)


def _lines(session: Session, tree: str | None, path: str, start: int, count: int) -> Lines:
    if start < 1 or not 1 <= count <= MAX_LINES:
        raise Refused(422, "invalid_range", f"start from line 1; count between 1 and {MAX_LINES}.")
    parts = fs.parts_of(path)
    if not parts:
        raise fs.Outside("no file named")
    literal = "/".join(parts)
    project = session.project
    if tree is None:
        with fs.project_root(session_tree(session.pk, project.path).path) as root:
            try:
                data, _ = fs.read_file(root, literal, conf.file_max_bytes())
            except fs.TooBig:
                raise Refused(413, "file_too_large", "The file is too large to show here.") from None
    else:
        data = _blob(services.store_of(project, session.pk), tree, literal)
    text = data.decode("utf-8", errors="replace").splitlines()
    return Lines(literal, start, text[start - 1 : start - 1 + count], len(text))


def _blob(store: Store, tree: str, path: str) -> bytes:
    try:
        listed = store.git("--literal-pathspecs", "ls-tree", "-z", tree, "--", path)
    except StoreError:
        raise Refused(
            409, "checkpoint_unavailable", "The checkpoints of this turn are no longer stored."
        ) from None
    meta, _, _ = listed.partition(b"\t")
    fields = meta.decode().split(" ")
    if len(fields) != 3 or fields[1] != "blob":
        raise fs.Outside(f"{path!r} is not a file in that checkpoint")
    size = int(store.git("cat-file", "-s", fields[2]).decode().strip() or 0)
    if size > conf.file_max_bytes():
        raise Refused(413, "file_too_large", "The file is too large to show here.")
    return store.blobs([fields[2]])[fields[2]]
