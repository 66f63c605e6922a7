"""Which queued run a runner takes next: fair across users, within their slots, where it may run.

Design note: docs/runner.md ("Fairness", "Placement"). Among the queued runs this runner's offer
serves (runs.placement) whose user has fewer than the limit executing, the user with the fewest
executing goes first, then the user whose oldest waiting run is oldest; within a user, oldest
first. So turns go round-robin by user: forty queued by one user do not hold back another's one.
The PostgreSQL claim (runs.runner.leases) is one statement of these CTEs; SQLite reads the same
order here in Python, inside its IMMEDIATE transaction.
"""

from __future__ import annotations

from collections import Counter

from runs.models import EXECUTING_STATUSES, Run, RunStatus
from runs.placement import Offer


def ranked_statement(run: str, session: str, project: str) -> str:
    """The CTEs `eligible`, `busy`, `ranked` and `next` (the first two runs in order, `rank` 1, 2)."""
    joins = f"FROM {run} r JOIN {session} s ON s.id = r.session_id JOIN {project} p ON p.id = s.project_id"
    return (
        f"eligible AS MATERIALIZED (SELECT r.id, r.created_at, p.owner_id {joins} "
        "WHERE r.status = %(queued)s AND p.required_labels <@ %(labels)s::jsonb "
        "AND NOT (p.agent = ANY(%(unserved)s::text[])) "
        "AND EXISTS (SELECT 1 FROM unnest(%(roots)s::text[]) AS root(path) WHERE p.path = root.path "
        "OR starts_with(p.path, rtrim(root.path, '/') || '/'))), "
        f"busy AS (SELECT p.owner_id, count(*) AS n {joins} WHERE r.status = ANY(%(executing)s::text[]) "
        "AND p.owner_id IN (SELECT owner_id FROM eligible) GROUP BY p.owner_id), "
        "ranked AS (SELECT e.id, e.created_at, coalesce(b.n, 0) AS n, "
        "min(e.created_at) OVER (PARTITION BY e.owner_id) AS first_at "
        "FROM eligible e LEFT JOIN busy b ON b.owner_id = e.owner_id), "
        "next AS MATERIALIZED (SELECT id, row_number() OVER (ORDER BY n, first_at, created_at, id) AS rank "
        "FROM ranked WHERE n < %(limit)s ORDER BY rank LIMIT 2)"
    )


def next_runs(offer: Offer, limit: int) -> list[int]:
    """The ids of the first two runs `ranked_statement` would rank (SQLite's claim)."""
    rows = Run.objects.filter(status=RunStatus.QUEUED).values_list(
        "pk",
        "created_at",
        "session__project__owner_id",
        "session__project__required_labels",
        "session__project__path",
        "session__project__agent",
    )
    eligible = [
        (pk, created, owner)
        for pk, created, owner, labels, path, agent in rows
        if offer.serves(path, labels or [], agent)
    ]
    if not eligible:
        return []
    owners = {owner for _, _, owner in eligible}
    busy = Counter(
        Run.objects.filter(status__in=EXECUTING_STATUSES, session__project__owner_id__in=owners).values_list(
            "session__project__owner_id", flat=True
        )
    )
    first_at: dict[int, object] = {}
    for _, created, owner in sorted(eligible, key=lambda row: row[1]):
        first_at.setdefault(owner, created)
    runnable = [row for row in eligible if busy[row[2]] < limit]
    runnable.sort(key=lambda row: (busy[row[2]], first_at[row[2]], row[1], row[0]))
    return [pk for pk, _, _ in runnable[:2]]
