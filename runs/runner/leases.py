"""Claiming queued runs, holding leases, reaping runs whose runner vanished.

Design note: docs/runner.md ("Claiming and serialising", "Leases and crashes"). A
claim is a conditional UPDATE (status still `queued`), taken with SKIP LOCKED on
PostgreSQL so several runners never wait on, or execute, the same run. A session
never has two active runs (a partial unique index), so turns are serialised per
session whatever the number of runners. What an execution needs beyond the
claimed row is added in runs/runner/claims.py.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, NamedTuple

import psycopg
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from projects.models import Project, Session
from runs import placement
from runs.models import EXECUTING_STATUSES, Run, Runner, RunStatus
from runs.placement import Offer
from runs.runner import fair_order
from runs.turns import do_mark_interrupted


def _lease_until() -> timezone.datetime:
    return timezone.now() + timedelta(seconds=settings.HERMESWEB_LEASE_SECONDS)


class RunnerIdInUse(Exception):
    """Another runner that is alive holds this id: two runners must never share one (leases)."""


def register_runner(runner_id: str) -> Runner:
    """Register this process under `runner_id`; an id whose runner stopped or went silent is reused.

    A fixed id (`runner --id`, one per systemd instance) survives restarts; an id whose
    runner still heartbeats raises RunnerIdInUse.
    """
    offer = placement.this_runner()  # advertised: the web tells from it what no runner serves
    served = {"labels": list(offer.labels), "roots": list(offer.roots)}
    with transaction.atomic():
        existing = Runner.objects.select_for_update().filter(pk=runner_id).first()
        if existing is None:
            return Runner.objects.create(id=runner_id, host=socket.gethostname(), pid=os.getpid(), **served)
        if Runner.objects.alive().filter(pk=runner_id).exists():
            raise RunnerIdInUse(
                f"runner id {runner_id!r} is in use by pid {existing.pid} on {existing.host} "
                "(it heartbeats); stop it or choose another id"
            )
        now = timezone.now()
        previous_pid = existing.pid
        existing.host, existing.pid = socket.gethostname(), os.getpid()
        existing.started_at, existing.heartbeat_at, existing.stopped_at = now, now, None
        existing.labels, existing.roots = served["labels"], served["roots"]
        existing.save()
    # Its previous process's runs are ours by name only, and a reaper skips its own id.
    for run in Run.objects.executing().filter(lease_owner=runner_id):
        reason = f"runner {runner_id} (pid {previous_pid}) stopped while the turn was executing"
        do_mark_interrupted(run, reason, code="runner_lost")
    return existing


def heartbeat(runner_id: str, capabilities: dict | None = None) -> None:
    fields: dict = {"heartbeat_at": timezone.now()}
    if capabilities is not None:
        fields["agent_capabilities"] = capabilities
    Runner.objects.filter(pk=runner_id).update(**fields)


def mark_stopped(runner_id: str) -> None:
    Runner.objects.filter(pk=runner_id).update(stopped_at=timezone.now())


@dataclass(frozen=True)
class ClaimedRun:
    """A run this runner took, with what starting it reads of its session and project."""

    run_id: int
    source: str
    prompt_text: str
    session_id: int
    agent_session_id: str
    model: str
    mode: str
    project_id: int
    project_name: str
    cwd: str
    agent: str
    # The run's journal as claimed: its writer tells from it whether a write whose answer
    # was lost committed (runs.runner.writer, "exactly once").
    last_seq: int
    # The run's attachments as stored, [{id, name, mime_type, size}] (runs.runner.prompt_content).
    attachments: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def of(cls, run: Run) -> ClaimedRun:
        session, project = run.session, run.session.project
        return cls(
            run.pk,
            run.source,
            run.prompt_text,
            session.pk,
            session.agent_session_id,
            session.model,
            session.mode,
            project.pk,
            project.name,
            project.path,
            project.agent,
            run.last_seq,
            run.attachments,
        )


class Claim(NamedTuple):
    """What one claim returns: the run it took (None: nothing queued, or another runner won it),
    and whether a second queued run was there to take."""

    run: ClaimedRun | None
    more: bool


NOTHING = Claim(None, False)


def claim_in_transaction(runner_id: str, offer: Offer | None = None) -> Claim:
    """Take the next queued run this runner may take, with the columns of its session and project.

    Which one: docs/runner.md ("Fairness", "Placement"): a run whose project and agent this
    runner's `offer` serves, of a user below HERMESWEB_MAX_ACTIVE_RUNS_PER_USER executing runs,
    the users with fewest executing first (then whose oldest waiting run is oldest), oldest first
    within a user. Claims are serialised (an advisory lock on PostgreSQL, IMMEDIATE transactions
    on SQLite) so two runners never give a user a slot too many. Inside the caller's atomic()
    the claim commits (or not) with what follows it. `more` lets a runner that took the only
    runnable run skip asking again at once, beside the new turn's prompt.
    """
    offer = offer or placement.this_runner()
    if connection.vendor == "postgresql":
        # Django's psycopg cursors bind client-side: the lock and the claim go as one query.
        with connection.cursor() as cursor:
            cursor.execute(_claim_statement(), _claim_params(runner_id, offer))
            cursor.nextset()  # past the lock's row
            return _claim_result(cursor.fetchone())
    with transaction.atomic(savepoint=False):
        # SQLite: IMMEDIATE transactions serialise writers, so a read then an update is safe.
        found = fair_order.next_runs(offer, settings.HERMESWEB_MAX_ACTIVE_RUNS_PER_USER)
        if not found:
            return NOTHING
        run = Run.objects.select_related("session__project").get(pk=found[0])
        claimed = Run.objects.filter(pk=run.pk, status=RunStatus.QUEUED).update(
            status=RunStatus.RUNNING,
            lease_owner=runner_id,
            lease_expires_at=_lease_until(),
            started_at=timezone.now(),
        )
        return Claim(ClaimedRun.of(run) if claimed else None, len(found) > 1)


async def aclaim_postgres(
    conn: psycopg.AsyncConnection[Any],
    runner_id: str,
    now: datetime | None = None,
    offer: Offer | None = None,
) -> Claim:
    """claim_in_transaction's PostgreSQL statement on the runner's own connection, in its event
    loop (autocommit): no hop to a database thread and back on the way to a first token. Bound
    client-side, the lock and the claim are one simple query: one implicit transaction that
    commits by itself, one round trip."""
    params = _claim_params(runner_id, offer or placement.this_runner(), now)
    async with psycopg.AsyncClientCursor(conn) as cursor:
        await cursor.execute(_claim_statement(), params)
        cursor.nextset()  # past the lock's row
        return _claim_result(await cursor.fetchone())


# Claims wait on each other (briefly: one statement) so that the statement after the lock, with a
# snapshot of its own, sees every claim before it: a count of a user's executing runs in one
# statement's snapshot alone would let two runners each give that user the last slot.
CLAIM_LOCK = 4_307_431
CLAIM_LOCK_STATEMENT = f"SELECT pg_advisory_xact_lock({CLAIM_LOCK})"


def _claim_params(runner_id: str, offer: Offer, now: datetime | None = None) -> dict[str, Any]:
    """`now` becomes the claimed run's started_at: it names the claim (unstarted_claims)."""
    return {
        "queued": str(RunStatus.QUEUED),
        "running": str(RunStatus.RUNNING),
        "executing": [str(status) for status in EXECUTING_STATUSES],
        "labels": json.dumps(list(offer.labels)),
        "roots": list(offer.roots),
        "unserved": list(offer.unserved_agents),
        "limit": settings.HERMESWEB_MAX_ACTIVE_RUNS_PER_USER,
        "runner": runner_id,
        "until": _lease_until(),
        "now": now or timezone.now(),
    }


def _claim_result(row: tuple[Any, ...] | None) -> Claim:
    # The statement's columns are ClaimedRun's fields in order, then the count of `next`.
    if row is None:
        return NOTHING
    *columns, attachments, count = row
    # jsonb: Django's connection reads it as text, the runner's own psycopg one as a list.
    attachments = json.loads(attachments) if isinstance(attachments, str) else attachments
    return Claim(ClaimedRun(*columns, attachments), count > 1)


@lru_cache(maxsize=1)
def _claim_statement() -> str:
    """Pick the fair next run this runner serves (fair_order.STATEMENT), claim it, and return it
    with its session's and project's columns and whether another was runnable: one round trip."""
    quote = connection.ops.quote_name
    run, session, project = (quote(model._meta.db_table) for model in (Run, Session, Project))
    return (
        f"{CLAIM_LOCK_STATEMENT}; "
        f"WITH {fair_order.ranked_statement(run, session, project)}, "
        f"claimed AS (UPDATE {run} SET status = %(running)s, lease_owner = %(runner)s, "
        "lease_expires_at = %(until)s, started_at = %(now)s "
        "WHERE id = (SELECT id FROM next WHERE rank = 1) AND status = %(queued)s "
        "RETURNING id, source, prompt_text, session_id, last_seq, attachments) "
        "SELECT c.id, c.source, c.prompt_text, s.id, s.agent_session_id, s.model, s.mode, "
        "p.id, p.name, p.path, p.agent, c.last_seq, c.attachments, (SELECT count(*) FROM next) "
        f"FROM claimed c JOIN {session} s ON s.id = c.session_id JOIN {project} p ON p.id = s.project_id"
    )


def unstarted_claims(
    runner_id: str, claimed_at: Collection[datetime], running: Collection[int]
) -> list[ClaimedRun]:
    """Runs the claims sent at `claimed_at` took, that no execution knows of, with nothing journaled.

    What a claim leaves whose statement committed while its answer was lost with the
    connection: the run is ours, leased and executing, and no execution knows of it. Only
    those claims' runs: a run whose execution ended without a word written is not started again.
    """
    runs = (
        Run.objects.executing()
        .filter(lease_owner=runner_id, last_seq=0, started_at__in=list(claimed_at))
        .exclude(pk__in=list(running))
        .select_related("session__project")
        .order_by("created_at", "id")
    )
    return [ClaimedRun.of(run) for run in runs]


def renew_leases(runner_id: str, run_ids: list[int]) -> set[int]:
    """Extend our leases; returns the runs we still hold (a reaper may have taken some).

    A statement (and transaction) per run: one UPDATE of them all locked the rows in its scan's
    order while the journal writer's batch locks them in its own, and the two deadlocked
    (bench/soak.py). Holding one row at a time, the renewal is never part of a cycle.
    """
    until = _lease_until()
    mine = Run.objects.executing().filter(lease_owner=runner_id)
    return {run_id for run_id in run_ids if mine.filter(pk=run_id).update(lease_expires_at=until)}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_stale(reaper_id: str) -> list[int]:
    """Interrupt executing runs whose runner is gone. Never re-prompts them.

    A run is stale when its lease expired, or at once when its runner ran on
    this host and its pid is dead (a restart after `kill -9` need not wait).
    """
    now = timezone.now()
    host = socket.gethostname()
    reaped: list[int] = []
    # Read the runs once, then their owners: a run claimed between two reads of the
    # queryset would have an owner missing from `owners` and be reaped as "unknown".
    executing = list(Run.objects.executing().exclude(lease_owner=reaper_id))
    owners = {r.id: r for r in Runner.objects.filter(pk__in={run.lease_owner for run in executing})}
    for run in executing:
        owner = owners.get(run.lease_owner)
        dead_here = owner is not None and owner.host == host and not _pid_alive(owner.pid)
        if not (run.lease_is_stale(now) or dead_here or (owner is None and run.lease_owner)):
            continue
        if owner is None:
            reason = f"runner {run.lease_owner or '?'} is unknown; the turn was interrupted"
        elif dead_here:
            reason = f"runner {owner.id} (pid {owner.pid}) died while the turn was executing"
        else:
            reason = (
                f"runner {owner.id} stopped renewing its lease (last heartbeat {owner.heartbeat_at:%H:%M:%S})"
            )
        if do_mark_interrupted(run, reason, code="runner_lost"):
            reaped.append(run.pk)
        if owner is not None and owner.stopped_at is None and dead_here:
            Runner.objects.filter(pk=owner.pk).update(stopped_at=now)
    return reaped
