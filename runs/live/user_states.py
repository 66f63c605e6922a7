"""The live state of all of one user's sessions: the read (one query) and the `sessions` frame.

Design note: docs/live-delivery.md ("The user's sessions"). The sidebar, the tab title and the
background notifications are drawn from it; `runs.live.user_feed` sends it to the sockets.
No channel layer here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from django.db.models import Count, IntegerField, OuterRef, Subquery, Value
from django.db.models.functions import Coalesce

from intents.models import PendingIntent
from projects.models import Session, SessionStatus
from runs import capacity
from runs.live.protocol import encode
from runs.models import ACTIVE_STATUSES, EventType, JournalEvent, Run, RunStatus

AWAITING_STATUSES = (RunStatus.AWAITING_APPROVAL, RunStatus.AWAITING_CLARIFY)
# A last run that ended so is shown until the next one starts.
FAILED_STATUSES = (RunStatus.FAILED, RunStatus.INTERRUPTED)


class SessionState(NamedTuple):
    """What the sidebar shows of one session. Equal states: nothing to send."""

    id: int
    project_id: int
    title: str
    archived: bool
    run_id: int | None  # the active run
    run_status: str | None  # its status: queued, running, awaiting_approval, awaiting_clarify, cancelling
    queued: int  # open intents (waiting or stopping)
    # The seq of the active run's newest approval/clarify request while it waits on the user:
    # with run_id, it names the request, so a browser notifies once per request.
    waiting_seq: int | None
    last_run_id: int | None  # the newest run, active or not
    last_run_status: str | None
    # Why a queued run waits (runs/capacity.py): {reason, running, position, labels, path}.
    waiting: dict[str, Any] | None = None

    @property
    def idle(self) -> bool:
        """Nothing to show: a snapshot leaves such sessions out."""
        return self.run_id is None and not self.queued and self.last_run_status not in FAILED_STATUSES

    def as_dict(self) -> dict[str, Any]:
        return self._asdict()


def read_states(user_id: Any) -> dict[int, SessionState]:
    """Every session of the user's projects, with its live state: one SQL statement (sync)."""
    runs = Run.objects.filter(session_id=OuterRef("pk")).order_by("-id")
    active = runs.filter(status__in=ACTIVE_STATUSES)
    open_intents = (
        PendingIntent.objects.filter(session_id=OuterRef("pk"))
        .open()
        .order_by()
        .values("session_id")
        .annotate(n=Count("pk"))
        .values("n")
    )
    # Only a run that waits has a pending request; its newest request is near the journal's end.
    waiting = (
        JournalEvent.objects.filter(
            run__session_id=OuterRef("pk"),
            run__status__in=AWAITING_STATUSES,
            type__in=(EventType.APPROVAL_REQUESTED, EventType.CLARIFY_REQUESTED),
        )
        .order_by("-run_id", "-seq")
        .values("seq")[:1]
    )
    rows = (
        Session.objects.filter(project__owner_id=user_id)
        .order_by()
        .annotate(
            active_id=Subquery(active.values("id")[:1]),
            active_status=Subquery(active.values("status")[:1]),
            last_id=Subquery(runs.values("id")[:1]),
            last_status=Subquery(runs.values("status")[:1]),
            open_count=Coalesce(Subquery(open_intents, output_field=IntegerField()), Value(0)),
            waiting_seq=Subquery(waiting),
        )
        .values_list(
            "pk",
            "project_id",
            "title",
            "status",
            "active_id",
            "active_status",
            "open_count",
            "waiting_seq",
            "last_id",
            "last_status",
        )
    )
    states = {}
    for pk, project_id, title, status, run_id, run_status, queued, seq, last_id, last_status in rows:
        states[pk] = SessionState(
            pk,
            project_id,
            title,
            status == SessionStatus.ARCHIVED,
            run_id,
            run_status,
            queued,
            seq if run_status in AWAITING_STATUSES else None,
            last_id,
            last_status,
        )
    # Only a queued run can wait; most reads have none and pay nothing more.
    queued = [state.run_id for state in states.values() if state.run_status == RunStatus.QUEUED]
    waits = capacity.waiting_of(run_id for run_id in queued if run_id) if queued else {}
    for state in list(states.values()):
        if state.run_id in waits:
            states[state.id] = state._replace(waiting=waits[state.run_id].as_dict())
    return states


class Changes(NamedTuple):
    changed: list[SessionState]
    removed: list[int]


def changes(old: dict[int, SessionState], new: dict[int, SessionState]) -> Changes:
    return Changes(
        [state for pk, state in new.items() if old.get(pk) != state],
        [pk for pk in old if pk not in new],
    )


def snapshot_frame(states: Iterable[SessionState]) -> str:
    """All the user's sessions that are not idle; a session left out is idle."""
    return encode(
        {"type": "sessions", "snapshot": True, "sessions": [s.as_dict() for s in states if not s.idle]}
    )


def delta_frame(found: Changes) -> str:
    """The sessions whose state changed (in full, idle ones too) and the ones deleted."""
    return encode(
        {
            "type": "sessions",
            "snapshot": False,
            "sessions": [s.as_dict() for s in found.changed],
            "removed": found.removed,
        }
    )
