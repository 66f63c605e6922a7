"""The database reads of live delivery, batched; synchronous (called through database_sync_to_async).

Design note: docs/live-delivery.md ("Layout", "The feed"). The hub's safety poll reads every
feed of the process at once (`poll_states`); a subscription's replay and the feed's gap repair
read pages of encoded envelopes (`read_page`); a subscribe resolves its cursors here
(`plan_subscription`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

import orjson
from channels.db import database_sync_to_async
from django.db.models import Count, Max, Q

from intents.models import PendingIntent
from intents.previews import INTENT_PREVIEW_CHARS, intent_preview
from projects.models import Session
from runs import journal
from runs.live.protocol import error_frame
from runs.models import ACTIVE_STATUSES, TERMINAL_STATUSES, Run

_TERMINAL = frozenset(s.value for s in TERMINAL_STATUSES)
# Sessions per query of a batched poll: each adds a term to one OR (SQLite's expression depth).
POLL_CHUNK = 200


def can_view(user: Any, session_id: int) -> bool:
    return Session.objects.visible_to(user).filter(pk=session_id).exists()


def run_floor(session_id: int) -> int:
    """The session's newest run id: runs above it started later (ids grow under the session lock)."""
    return Run.objects.filter(session_id=session_id).aggregate(top=Max("pk"))["top"] or 0


# The `session` frame must stay under daphne's 1 MiB message limit (an oversized frame closes the
# socket for good), yet up to HERMESWEB_MAX_QUEUED_INTENTS intents of 1 MB each may wait: each text
# goes out as a preview (the full one is at GET /api/sessions/{id}/intents), and if the frame still
# exceeds SNAPSHOT_MAX_BYTES the previews shrink, then intents are left out (docs/live-delivery.md).
SNAPSHOT_MAX_BYTES = 512 * 1024
INTENT_SHORT_PREVIEW_CHARS = 200


def session_snapshot(session_id: int) -> dict[str, Any] | None:
    """The `session` frame's body, or None when the session is gone; at most SNAPSHOT_MAX_BYTES as JSON."""
    session = Session.objects.select_related("project").filter(pk=session_id).first()
    if session is None:
        return None
    active = Run.objects.filter(session_id=session_id).active().values_list("pk", "status").first()
    intents = list(PendingIntent.objects.filter(session_id=session_id).open().order_by("position", "id"))
    snapshot = {
        "session_id": session.pk,
        "status": session.status,
        "active_run_id": active[0] if active else None,
        "active_run_status": active[1] if active else None,
        "title": session.title,
        "commands": session.commands,
        # The composer's mode and model pickers (docs/agents.md, "Modes and models").
        "mode": session.mode,
        "model": session.model,
        "modes": session.available_modes,
        "models": session.available_models,
        # The config option pickers beside them (projects/session_options.py).
        "config_options": session.config_options,
        "config": session.config,
        "intents": [intent_preview(intent, INTENT_PREVIEW_CHARS) for intent in intents],
        "intents_omitted": 0,
        "agent": session.project.agent,
        "running_default": session.project.running_default,
    }
    return bound_snapshot(snapshot, intents)


def _size(snapshot: dict[str, Any]) -> int:
    return len(orjson.dumps(snapshot))


def bound_snapshot(snapshot: dict[str, Any], intents: list[PendingIntent]) -> dict[str, Any]:
    """Shrink the previews, then leave out the last intents, until the snapshot fits SNAPSHOT_MAX_BYTES."""
    if _size(snapshot) <= SNAPSHOT_MAX_BYTES:
        return snapshot
    snapshot["intents"] = [intent_preview(i, INTENT_SHORT_PREVIEW_CHARS, meta=False) for i in intents]
    while snapshot["intents"] and _size(snapshot) > SNAPSHOT_MAX_BYTES:
        # Halving keeps this to a few encodings however many intents there are.
        keep = len(snapshot["intents"]) // 2
        snapshot["intents_omitted"] += len(snapshot["intents"]) - keep
        snapshot["intents"] = snapshot["intents"][:keep]
    return snapshot


@dataclass(frozen=True)
class RunHead:
    run_id: int
    last_seq: int
    status: str

    @property
    def terminal(self) -> bool:
        return self.status in _TERMINAL


class HeadsWanted(NamedTuple):
    """Which runs of a session a poll reads besides the active ones."""

    run_ids: Collection[int]
    above: int | None  # and every run with a higher id


class Marker(NamedTuple):
    """A cheap fingerprint of the session snapshot: when it changes, the snapshot is read again."""

    updated_at: datetime
    # Written without bumping updated_at:
    title: str
    status: str
    commands: Any
    project_updated_at: datetime
    intents_updated_at: datetime | None
    intents: int
    active: tuple[int, str] | None  # the active run's id and status


class PollState(NamedTuple):
    heads: list[RunHead]
    marker: Marker | None  # None: the session is gone


class FeedStart(NamedTuple):
    floor: int  # the session's newest run id, read first
    heads: list[RunHead]
    marker: Marker | None


def run_heads(session_id: int, run_ids: Collection[int] = (), above: int | None = None) -> list[RunHead]:
    """The session's active runs, plus `run_ids`, plus runs newer than `above`."""
    return runs_heads({session_id: HeadsWanted(run_ids, above)})[session_id]


def runs_heads(wanted: Mapping[int, HeadsWanted]) -> dict[int, list[RunHead]]:
    """`run_heads` for many sessions (by session id), in one query per POLL_CHUNK sessions."""
    heads: dict[int, list[RunHead]] = {session_id: [] for session_id in wanted}
    items = list(wanted.items())
    for start in range(0, len(items), POLL_CHUNK):
        chunk = items[start : start + POLL_CHUNK]
        condition = Q(status__in=ACTIVE_STATUSES) | Q(pk__in=[pk for _, w in chunk for pk in w.run_ids])
        for session_id, w in chunk:
            if w.above is not None:
                condition |= Q(session_id=session_id, pk__gt=w.above)
        rows = (
            Run.objects.filter(session_id__in=[session_id for session_id, _ in chunk])
            .filter(condition)
            .order_by("pk")
            .values_list("session_id", "pk", "last_seq", "status")
        )
        for session_id, pk, last_seq, status in rows:
            heads[session_id].append(RunHead(pk, last_seq, status))
    return heads


def session_marker(session_id: int, heads: list[RunHead] | None = None) -> Marker | None:
    if heads is None:
        heads = run_heads(session_id)
    return session_markers({session_id: heads})[session_id]


def session_markers(heads: Mapping[int, list[RunHead]]) -> dict[int, Marker | None]:
    """`session_marker` for many sessions (their heads given), in two queries per chunk."""
    markers: dict[int, Marker | None] = dict.fromkeys(heads)
    ids = list(heads)
    for start in range(0, len(ids), POLL_CHUNK):
        chunk = ids[start : start + POLL_CHUNK]
        rows = Session.objects.filter(pk__in=chunk).values_list(
            "pk", "updated_at", "title", "status", "commands", "project__updated_at"
        )
        intents = {
            session_id: (at, n)
            for session_id, at, n in PendingIntent.objects.filter(session_id__in=chunk)
            .order_by()
            .values("session_id")
            .annotate(at=Max("updated_at"), n=Count("pk"))
            .values_list("session_id", "at", "n")
        }
        for session_id, *row in rows:
            active = next(((h.run_id, h.status) for h in heads[session_id] if not h.terminal), None)
            markers[session_id] = Marker(*row, *intents.get(session_id, (None, 0)), active)
    return markers


def poll_states(wanted: Mapping[int, HeadsWanted]) -> dict[int, PollState]:
    """Heads and marker of many sessions at once: the process-wide safety poll's reads."""
    heads = runs_heads(wanted)
    markers = session_markers(heads)
    return {session_id: PollState(heads[session_id], markers[session_id]) for session_id in wanted}


def feed_start_state(session_id: int) -> FeedStart:
    # The floor first: a run created after this read has a higher id, so the feed follows it.
    floor = run_floor(session_id)
    heads, marker = poll_states({session_id: HeadsWanted((), floor)})[session_id]
    return FeedStart(floor, heads, marker)


def read_page(run_id: int, after_seq: int, upto: int | None = None) -> journal.EncodedPage:
    """Envelopes of one run with after_seq < seq ≤ upto, one bounded page; CursorAhead/CursorExpired."""
    run = Run.objects.only("pk", "session_id", "status", "last_seq", "compacted_through").get(pk=run_id)
    return journal.read_encoded(run, after_seq, upto=upto)


@dataclass
class Plan:
    """What a subscribe resolves to: runs to replay (run id → cursor), errors to send, the run floor."""

    cursors: dict[int, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    refused: set[int] = field(default_factory=set)
    floor: int = 0


def plan_subscription(session_id: int, after: dict[int, int], floor_before: int) -> Plan:
    """Resolve the client's cursors against the journal.

    Cursored runs are followed from their cursor, ended or not, so a replay reaches their
    terminal event. The active run, and any run started since `floor_before` (read before the
    subscriber joined its feed), are followed from seq 0 unless a cursor says otherwise.
    """
    plan = Plan(floor=run_floor(session_id))
    runs = {
        run.pk: run
        for run in Run.objects.filter(session_id=session_id)
        .filter(Q(pk__in=list(after)) | Q(status__in=ACTIVE_STATUSES) | Q(pk__gt=floor_before))
        .only("pk", "last_seq", "compacted_through", "status")
    }
    for run_id, seq in after.items():
        run = runs.get(run_id)
        if run is None:
            plan.refused.add(run_id)
            plan.errors.append(
                error_frame("bad_request", f"run {run_id} is not a run of this session", run_id=run_id)
            )
            continue
        try:
            journal.check_cursor(run, seq)
        except journal.JournalError as exc:
            plan.refused.add(run_id)
            plan.errors.append(error_frame(exc.code, str(exc), run_id=run_id, last_seq=run.last_seq))
            continue
        plan.cursors[run_id] = seq
    for run_id, run in runs.items():
        if run_id not in after and (run.is_active or run_id > floor_before):
            plan.cursors[run_id] = 0
    return plan


def pooled[T](fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """`fn` as database_sync_to_async runs it (old connections closed around it; a usable SQLite
    connection is kept: settings, CONN_MAX_AGE), but in the event loop's thread pool.

    Not in the one thread that database_sync_to_async shares with every socket's handshake
    (channels' get_user): in a storm of 200 reconnects, the replays queued there held the
    handshakes past daphne's 5 s (docs/reliability.md, reconnect storm).
    """
    return database_sync_to_async(fn, thread_sensitive=False)
