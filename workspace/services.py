"""The workspace's actions: checkpoints (the runner's), changes, rewind and restore, files.

Design note: docs/workspace.md. The runner calls `take_checkpoint` (in a thread of its own);
the API calls the rest. Refusals are `Refused` with the API's status and code. Every path
inside a project goes through workspace/fs.py (no symlink followed), every tree through the
project's private store (workspace/store.py).
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from projects.models import Project, Session
from projects.refusals import Refused as BaseRefused
from runs import journal
from runs.journal import NewEvent, done_event
from runs.journal.payloads import FilesRestored, RunStarted
from runs.models import EventType, Run, RunSource, RunStatus
from workspace import conf, fs
from workspace.models import Checkpoint, CheckpointKind, ProjectCheckpoints
from workspace.store import (
    MODE_EXECUTABLE,
    MODE_GITLINK,
    MODE_SYMLINK,
    FileChange,
    Snapshot,
    Store,
    StoreError,
    TooLarge,
)
from worktrees.trees import session_tree

log = logging.getLogger(__name__)

MAX_ENTRIES = 1000
DIFF_TOTAL_MAX = 4 * 1024 * 1024


class Refused(BaseRefused):
    """A workspace action refused: the API's one handler answers `status` with `code`."""


def store_of(project: Project, session_id: int | None = None) -> Store:
    """The project's store over the tree the session works in (its own worktree: docs/worktrees.md)."""
    tree = session_tree(session_id, project.path).path if session_id is not None else project.path
    return Store(project.pk, tree)


def checkpoints_off(project_id: int) -> str:
    """Why checkpoints are off for the project, or "" when they are on."""
    state = (
        ProjectCheckpoints.objects.filter(project_id=project_id).values_list("off_reason", flat=True).first()
    )
    return state or ""


# ---------------------------------------------------------------- the runner's checkpoints


@dataclass(frozen=True)
class TurnFacts:
    """What a run's checkpoints read of the database, in one go, beside the agent's start."""

    off: bool  # checkpoints are off for the project
    note: str  # for the prompt: files restored since the agent's last turn ("" when none)


def turn_facts(*, run_id: int, session_id: int, project_id: int) -> TurnFacts:
    return TurnFacts(bool(checkpoints_off(project_id)), restored_note(session_id=session_id, run_id=run_id))


def record_checkpoint(*, run_id: int, session_id: int, project_id: int, kind: str, snapshot: Snapshot) -> int:
    """The run's `kind` checkpoint of the tree the runner just wrote into the store."""
    row = Checkpoint.objects.create(
        project_id=project_id,
        session_id=session_id,
        run_id=run_id,
        kind=kind,
        tree=snapshot.tree,
        stats=snapshot.stats(),
    )
    return row.pk


def turn_checkpoints_off(project_id: int, reason: str) -> None:
    """The project's tree is over the caps: no more checkpoints for it until staff turn them on
    again (the admin), so its turns do not pay for a tree walk each."""
    ProjectCheckpoints.objects.update_or_create(project_id=project_id, defaults={"off_reason": reason})
    log.warning("checkpoints off for project %s: %s", project_id, reason)


# Paths named in the note to the agent; more are counted.
NOTE_PATHS = 20


def restored_note(*, session_id: int, run_id: int) -> str:
    """A note for the agent's next prompt when files were restored (rewind or undo) since its
    last turn: its context still remembers the contents they had. "" when none were."""
    last = (
        Checkpoint.objects.filter(session_id=session_id, kind__in=[CheckpointKind.START, CheckpointKind.END])
        .exclude(run_id=run_id)
        .order_by("-pk")
        .values_list("pk", flat=True)
        .first()
    )
    paths: list[str] = []
    for restored in Checkpoint.objects.filter(
        session_id=session_id, kind__in=[CheckpointKind.REWIND, CheckpointKind.RESTORE], pk__gt=last or 0
    ).values_list("restored", flat=True):
        paths += [p for p in restored if p not in paths]
    if not paths:
        return ""
    shown = ", ".join(paths[:NOTE_PATHS]) + (
        f" and {len(paths) - NOTE_PATHS} more" if len(paths) > NOTE_PATHS else ""
    )
    return (
        "[hermesweb] Since your last turn the user restored files in the project to earlier contents "
        f"(rewind): {shown}. Read them again before relying on what you remember of them."
    )


# ---------------------------------------------------------------- changes


@dataclass
class Changes:
    run_id: int | None
    complete: bool
    files: list[FileChange] = field(default_factory=list)
    notice: str = ""


def _now(store: Store) -> Snapshot:
    """A snapshot of the project now; Refused (409) over the caps or when it cannot be taken."""
    try:
        return store.snapshot()
    except TooLarge as exc:
        raise Refused(409, "checkpoints_off", str(exc)) from None
    except StoreError as exc:
        log.warning("snapshot of %s: %s", store.work_tree, exc)
        raise Refused(409, "project_unavailable", "The project's directory cannot be read now.") from None


def _now_tree(store: Store) -> str:
    return _now(store).tree


def _diff(store: Store, old: str, new: str) -> list[FileChange]:
    try:
        return store.changes(old, new, diff_max=conf.diff_max_bytes(), total_max=DIFF_TOTAL_MAX)
    except StoreError as exc:
        log.warning("changes %s..%s: %s", old, new, exc)
        raise Refused(
            409, "checkpoint_unavailable", "The checkpoints of this turn are no longer stored."
        ) from None


def run_changes(run: Run) -> Changes:
    """The project's tree from `run`'s start checkpoint to its end one; to now while it runs or
    when it never ended (a crashed runner), `complete` false then."""
    project = run.session.project
    start = Checkpoint.objects.of_run(run.pk, CheckpointKind.START)
    if start is None:
        return Changes(run.pk, run.is_terminal, notice=_missing_notice(project, run))
    end = Checkpoint.objects.of_run(run.pk, CheckpointKind.END)
    store = store_of(project, run.session_id)
    if end is not None:
        return Changes(run.pk, True, _diff(store, start.tree, end.tree))
    return Changes(run.pk, False, _diff(store, start.tree, _now_tree(store)))


def session_changes(session: Session) -> Changes:
    """From before the session's first checkpointed run to the end of its last (now, while one runs)."""
    project = session.project
    last_run = session.runs.order_by("-created_at", "-pk").first()  # type: ignore[attr-defined]
    first = Checkpoint.objects.first_of_session(session.pk)
    latest = Checkpoint.objects.latest_of_session(session.pk)
    run_id = last_run.pk if last_run else None
    if first is None or latest is None:
        return Changes(run_id, last_run is None or last_run.is_terminal, notice=checkpoints_off(project.pk))
    store = store_of(project, session.pk)
    busy = session.runs.active().exists()  # type: ignore[attr-defined]
    if busy or latest.kind == CheckpointKind.START:
        return Changes(run_id, False, _diff(store, first.tree, _now_tree(store)))
    return Changes(run_id, True, _diff(store, first.tree, latest.after_tree))


@dataclass(frozen=True)
class TurnSummary:
    run_id: int
    files: int
    additions: int
    deletions: int


# Runs one summary request may name.
SUMMARY_MAX_RUNS = 500


def turn_summaries(session: Session, run_ids: list[int] | None) -> list[TurnSummary]:
    """Per settled run of the session with both checkpoints: files changed, lines added and
    deleted. Counted once (git's numstat) and kept in the end checkpoint's stats, so a long
    session's page costs one query after its first view. Runs named but not of the session,
    still active or without checkpoints are left out."""
    ends = Checkpoint.objects.filter(session=session, kind=CheckpointKind.END).order_by("-pk")
    if run_ids is not None:
        ends = ends.filter(run_id__in=run_ids[:SUMMARY_MAX_RUNS])
    ends = list(ends[:SUMMARY_MAX_RUNS])
    starts = dict(
        Checkpoint.objects.filter(
            session=session, kind=CheckpointKind.START, run_id__in=[e.run_id for e in ends]
        ).values_list("run_id", "tree")
    )
    out: list[TurnSummary] = []
    store: Store | None = None
    for end in ends:
        counted = (end.stats or {}).get("summary")
        if counted is None and end.run_id in starts:
            store = store or store_of(session.project)
            try:
                counted = _numstat(store, starts[end.run_id], end.tree)
            except StoreError as exc:
                log.warning("summary of run %s: %s", end.run_id, exc)
                continue
            end.stats = {**(end.stats or {}), "summary": counted}
            end.save(update_fields=["stats"])
        if counted is not None and end.run_id is not None:
            out.append(TurnSummary(end.run_id, counted[0], counted[1], counted[2]))
    return out


def _numstat(store: Store, old: str, new: str) -> list[int]:
    """[files, additions, deletions] from tree `old` to `new` (a binary file counts no lines)."""
    files = added = deleted = 0
    for record in store.git("diff-tree", "-r", "-z", "--no-renames", "--numstat", old, new).split(b"\0"):
        if not record:
            continue
        plus, minus, _ = record.decode(errors="surrogateescape").split("\t", 2)
        files += 1
        added += int(plus) if plus.isdigit() else 0
        deleted += int(minus) if minus.isdigit() else 0
    return [files, added, deleted]


def _missing_notice(project: Project, run: Run) -> str:
    off = checkpoints_off(project.pk)
    if off:
        return off
    return "" if run.is_terminal else "The run's start checkpoint is not taken yet."


# ---------------------------------------------------------------- rewind and restore


@dataclass(frozen=True)
class Restored:
    status: str  # accepted | duplicate | preview (a dry run: nothing touched, `undo` 0)
    restored: list[str]
    undo: int  # the checkpoint of the tree this replaced: restoring it undoes this
    conflicts: list[str] = field(default_factory=list)  # a preview's: changed since by something else


def do_rewind(user: Any, run_id: int, client_id: str, force: bool = False, dry_run: bool = False) -> Restored:
    """Put every file the session changed from the start of run `run_id` on back to its bytes
    before that run. Precondition: the caller may see the run (else Run.DoesNotExist).

    Holds the session's lock throughout (no turn starts meanwhile); refuses while a run of the
    session is active (409 `session_busy`) and when a file changed since the session's last
    checkpoint (409 `rewind_conflict`, nothing touched) unless `force`. Idempotent by `client_id`.
    `dry_run`: what it would restore and what conflicts, touching nothing (the confirmation).
    """
    with transaction.atomic():
        run = Run.objects.visible_to(user).get(pk=run_id)
        session = Session.objects.lock(run.session_id)
        done = None if dry_run else _already(session, client_id)
        if done is not None:
            return done
        _refuse_busy(session)
        start = Checkpoint.objects.of_run(run.pk, CheckpointKind.START)
        if start is None:
            raise Refused(409, "no_checkpoint", "This turn has no checkpoint to rewind to.")
        done = _restore(session, start, CheckpointKind.REWIND, client_id, force, run=run, dry_run=dry_run)
        if not dry_run:
            _journal(session, done, action="rewind", forced=force, run=run)
        return done


def do_restore(
    user: Any, checkpoint_id: int, client_id: str, force: bool = False, dry_run: bool = False
) -> Restored:
    """Put the project's files back to checkpoint `checkpoint_id`'s tree — for a rewind's or a
    restore's checkpoint, the tree it replaced: its undo. Same rules as `do_rewind`."""
    with transaction.atomic():
        target = Checkpoint.objects.visible_to(user).get(pk=checkpoint_id)
        session = Session.objects.lock(target.session_id)
        done = None if dry_run else _already(session, client_id)
        if done is not None:
            return done
        _refuse_busy(session)
        done = _restore(session, target, CheckpointKind.RESTORE, client_id, force, run=None, dry_run=dry_run)
        if not dry_run:
            undid = target.kind in (CheckpointKind.REWIND, CheckpointKind.RESTORE)
            _journal(session, done, action="restore", forced=force, undid=undid)
        return done


# Paths a files.restored event names; `count` counts them all.
PATHS_SHOWN = 200


def _journal(
    session: Session,
    done: Restored,
    *,
    action: str,
    forced: bool,
    undid: bool = False,
    run: Run | None = None,
) -> None:
    """The rewind or restore as a `workspace` run of its own: run.started, files.restored, done.

    Its own run, because a settled run takes no event after its `done` and a run yet to come
    may never come; created ended, in the caller's transaction (the session's lock held), and
    published after commit like any append.
    """
    now = timezone.now()
    record = Run.objects.create(
        session=session,
        client_id=f"workspace:{done.undo}",
        prompt_text="",
        source=RunSource.WORKSPACE,
        source_meta={"checkpoint": done.undo},
        status=RunStatus.RUNNING,
        created_at=now,
        started_at=now,
    )
    payload: FilesRestored = {
        "action": "rewind" if action == "rewind" else "restore",
        "paths": done.restored[:PATHS_SHOWN],
        "count": len(done.restored),
        "undo": done.undo,
        "undid": undid,
        "forced": forced,
    }
    if run is not None:
        payload["run_id"] = run.pk
        payload["turn"] = turn_number(run)
    started: RunStarted = {"status": RunStatus.RUNNING.value, "session_id": session.pk, "source": "workspace"}
    journal.append_batch(
        record.pk,
        [
            NewEvent(EventType.RUN_STARTED, started),
            NewEvent(EventType.FILES_RESTORED, payload),
            done_event(RunStatus.COMPLETED),
        ],
    )


def turn_number(run: Run) -> int:
    """The run's place among its session's turns, 1-based; workspace runs are not turns."""
    return (
        Run.objects.filter(session_id=run.session_id)
        .exclude(source=RunSource.WORKSPACE)
        .filter(Q(created_at__lt=run.created_at) | Q(created_at=run.created_at, pk__lte=run.pk))
        .count()
    )


def _already(session: Session, client_id: str) -> Restored | None:
    row = Checkpoint.objects.filter(session=session, client_id=client_id).first()
    return None if row is None else Restored("duplicate", list(row.restored), row.pk)


def _refuse_busy(session: Session) -> None:
    if session.runs.active().exists():  # type: ignore[attr-defined]
        raise Refused(409, "session_busy", "A turn of this session is running; rewind when it has ended.")


def _restore(
    session: Session,
    target: Checkpoint,
    kind: str,
    client_id: str,
    force: bool,
    *,
    run: Run | None,
    dry_run: bool = False,
) -> Restored:
    """Write `target`'s version of each path that differs between it and the session's last
    known tree; record the replaced tree as a checkpoint. Call holding the session's lock."""
    project = session.project
    store = store_of(project, session.pk)
    now = _now(store)
    latest = Checkpoint.objects.latest_of_session(session.pk)
    # A run that never ended (a crashed runner) left only its start: what is there now is its end.
    expected = now.tree if latest is None or latest.kind == CheckpointKind.START else latest.after_tree
    try:
        paths = store.changed_paths(target.tree, expected)
        now_entries, expected_entries = store.entries(now.tree), store.entries(expected)
        wanted = store.entries(target.tree)
    except StoreError as exc:
        log.warning("restore of checkpoint %s: %s", target.pk, exc)
        raise Refused(409, "checkpoint_unavailable", "That checkpoint is no longer stored.") from None
    conflicts = [p for p in paths if now_entries.get(p) != expected_entries.get(p)]
    if dry_run:
        return Restored("preview", paths, 0, conflicts)
    if conflicts and not force:
        raise Refused(
            409,
            "rewind_conflict",
            "Files changed since this session's last turn; nothing was restored (send force to overwrite).",
            {"paths": conflicts},
        )
    try:
        row = Checkpoint.objects.create(
            project=project,
            session=session,
            run=run,
            kind=kind,
            tree=now.tree,
            restores=target,
            client_id=client_id,
            restored=paths,
            stats=now.stats(),
        )
    except IntegrityError:
        raise Refused(409, "conflict", "This client_id was just used.") from None
    _write_back(store, project, paths, wanted)
    row.result_tree = _now_tree(store)
    row.save(update_fields=["result_tree"])
    return Restored("accepted", paths, row.pk)


def _write_back(store: Store, project: Project, paths: list[str], wanted: dict[str, Any]) -> None:
    blobs = store.blobs([wanted[p].sha for p in paths if p in wanted and wanted[p].mode != MODE_GITLINK])
    try:
        root = fs.open_root(store.work_tree)  # the session's tree: its worktree, if it has one
    except fs.Outside:
        raise Refused(409, "project_unavailable", "The project's directory cannot be opened.") from None
    try:
        for path in paths:
            entry = wanted.get(path)
            try:
                if entry is None:
                    fs.remove_file(root, path)
                elif entry.mode == MODE_GITLINK:
                    continue  # a nested repository: its contents were never checkpointed
                elif entry.mode == MODE_SYMLINK:
                    fs.write_symlink(root, path, blobs[entry.sha])
                else:
                    fs.write_file(
                        root,
                        path,
                        blobs[entry.sha],
                        executable=entry.mode == MODE_EXECUTABLE,
                        create_dirs=True,
                        replace_links=True,
                    )
            except (fs.Outside, OSError) as exc:
                log.warning("restore of %s in project %s: %s", path, project.pk, exc)
    finally:
        os.close(root)


# ---------------------------------------------------------------- files


@dataclass(frozen=True)
class FileEntry:
    name: str
    path: str
    type: str  # file | dir | symlink | other
    size: int
    modified: datetime


def list_files(project: Project, path: str) -> tuple[str, list[FileEntry], bool]:
    """The directory `path` of the project: (its normalised path, entries dirs first, truncated)."""
    parts = fs.parts_of(path)
    with fs.project_root(project.path) as root:
        listed = fs.list_dir(root, "/".join(parts))
    base = "/".join(parts)
    entries = []
    for name, info in listed:
        kind = (
            "dir"
            if stat.S_ISDIR(info.st_mode)
            else "file"
            if stat.S_ISREG(info.st_mode)
            else "symlink"
            if stat.S_ISLNK(info.st_mode)
            else "other"
        )
        entries.append(
            FileEntry(
                name,
                f"{base}/{name}" if base else name,
                kind,
                info.st_size,
                datetime.fromtimestamp(info.st_mtime, tz=UTC),
            )
        )
    entries.sort(key=lambda e: (e.type != "dir", e.name))
    return base, entries[:MAX_ENTRIES], len(entries) > MAX_ENTRIES


def etag_of(data: bytes) -> str:
    return '"' + hashlib.sha256(data).hexdigest() + '"'


def read_file(project: Project, path: str) -> tuple[bytes, str]:
    """The file's bytes and ETag; fs.Outside for any path that is not a file inside the project."""
    with fs.project_root(project.path) as root:
        try:
            data, _ = fs.read_file(root, path, conf.file_max_bytes())
        except fs.TooBig:
            raise Refused(413, "file_too_large", "The file is too large to open here.") from None
    return data, etag_of(data)


def do_write_file(
    project: Project, path: str, data: bytes, *, if_match: str | None, if_none_match: str | None
) -> str:
    """Save `data` as the project's file `path`; its new ETag.

    `if_match` must be the ETag the file has now (412 `stale_file` otherwise); creating a file
    takes `if_none_match="*"` (412 when it exists); neither is 428 `precondition_required`.
    fs.Outside (a 404) first for a path that is not a file's place inside the project.
    """
    with fs.project_root(project.path) as root:
        current = _current(root, path)
        if if_match is None and if_none_match != "*":
            raise Refused(
                428,
                "precondition_required",
                "Send If-Match with the file's ETag (If-None-Match: * to create).",
            )
        if len(data) > conf.file_max_bytes():
            raise Refused(413, "file_too_large", "The file is too large to save here.")
        tag = None if current is None else etag_of(current)
        if if_match is not None and (tag is None or tag not in _tags(if_match)):
            raise Refused(412, "stale_file", "The file changed since it was read.", {"etag": tag})
        if if_match is None and tag is not None:
            raise Refused(412, "stale_file", "The file already exists.", {"etag": tag})
        fs.write_file(root, path, data)
    return etag_of(data)


def _current(root: int, path: str) -> bytes | None:
    """The file's bytes now, None when there is none yet; fs.Outside when its place is not a
    file's inside the project (its directory missing, a symlink, a directory)."""
    parts = fs.parts_of(path)
    if not parts:
        raise fs.Outside("no file named")
    parent = fs.open_dir(root, parts[:-1])
    try:
        os.lstat(parts[-1], dir_fd=parent)
    except FileNotFoundError:
        return None
    finally:
        os.close(parent)
    try:
        data, _ = fs.read_file(root, path, conf.file_max_bytes())
    except fs.TooBig:
        raise Refused(413, "file_too_large", "The file is too large to save here.") from None
    return data


def _tags(header: str) -> set[str]:
    return {tag.strip().removeprefix("W/") for tag in header.split(",")}
