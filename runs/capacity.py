"""Why a queued run waits: for one of its user's slots, or for a runner that can serve it.

Design note: docs/runner.md ("Fairness", "Placement"). Read for the API (GET /api/runs/{id},
GET /api/sessions/{id}), the sidebar's states and the header; the claim itself decides in
runs.runner.fair_order. Waiting is not failing: a waiting run is never timed out or dropped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any, NamedTuple

from django.conf import settings

from runs import placement
from runs.models import EXECUTING_STATUSES, Run, RunStatus

SLOT = "waiting_for_slot"
RUNNER = "waiting_for_runner"


class Waiting(NamedTuple):
    """Why a queued run has not started. `running`/`position` for a slot, `labels` for a runner."""

    reason: str
    running: int = 0  # the user's turns executing now
    position: int = 0  # 1: the next of the user's turns to start
    labels: list[str] = []  # what a runner must offer (runner), beside serving the project's root
    path: str = ""  # the project's directory, which the runner must serve (runner)

    def as_dict(self) -> dict[str, Any]:
        return self._asdict()


def limit() -> int:
    return settings.HERMESWEB_MAX_ACTIVE_RUNS_PER_USER


def waiting_of(run_ids: Iterable[int]) -> dict[int, Waiting]:
    """Why each of these runs that is still queued waits (a run about to be claimed: absent)."""
    rows = list(
        Run.objects.filter(pk__in=list(run_ids), status=RunStatus.QUEUED).values_list(
            "pk",
            "created_at",
            "session__project__owner_id",
            "session__project__required_labels",
            "session__project__path",
            "session__project__agent",
        )
    )
    if not rows:
        return {}
    owners = {row[2] for row in rows}
    busy = Counter(
        Run.objects.filter(status__in=EXECUTING_STATUSES, session__project__owner_id__in=owners).values_list(
            "session__project__owner_id", flat=True
        )
    )
    offers = placement.live_offers()
    found: dict[int, Waiting] = {}
    for pk, created, owner, labels, path, agent in rows:
        if not any(offer.serves(path, labels or [], agent) for offer in offers):
            needed = placement.required_labels(list(labels or []), agent)
            found[pk] = Waiting(RUNNER, labels=needed, path=path)
        elif busy[owner] >= limit():
            ahead = Run.objects.filter(
                status=RunStatus.QUEUED, session__project__owner_id=owner, created_at__lt=created
            ).count()
            found[pk] = Waiting(SLOT, running=busy[owner], position=ahead + 1)
    return found


def waiting_of_run(run: Run) -> dict[str, Any] | None:
    found = waiting_of([run.pk]).get(run.pk) if run.status == RunStatus.QUEUED else None
    return found.as_dict() if found else None


def waiting_of_session(session: Any) -> dict[str, Any] | None:
    """Why the session's active run waits, if it is queued (its `active_run_id` annotated or asked)."""
    run_id = getattr(session, "active_run_id", None)
    found = waiting_of([run_id]).get(run_id) if run_id else None
    return found.as_dict() if found else None
