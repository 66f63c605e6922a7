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
from typing import TYPE_CHECKING, Any, NamedTuple

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from projects.models import Project, Session
from runs.models import Run, Runner, RunStatus
from runs.turns import do_mark_interrupted

if TYPE_CHECKING:
    import psycopg


def _lease_until() -> timezone.datetime:
    return timezone.now() + timedelta(seconds=settings.HERMESWEB_LEASE_SECONDS)


class RunnerIdInUse(Exception):
    """Another runner that is alive holds this id: two runners must never share one (leases)."""


def register_runner(runner_id: str) -> Runner:
    """Register this process under `runner_id`; an id whose runner stopped or went silent is reused.

    A fixed id (`runner --id`, one per systemd instance) survives restarts; an id whose
    runner still heartbeats raises RunnerIdInUse.
    """
    with transaction.atomic():
        existing = Runner.objects.select_for_update().filter(pk=runner_id).first()
        if existing is None:
            return Runner.objects.create(id=runner_id, host=socket.gethostname(), pid=os.getpid())
        if Runner.objects.alive().filter(pk=runner_id).exists():
            raise RunnerIdInUse(
                f"runner id {runner_id!r} is in use by pid {existing.pid} on {existing.host} "
                "(it heartbeats); stop it or choose another id"
            )
        now = timezone.now()
        previous_pid = existing.pid
        existing.host, existing.pid = socket.gethostname(), os.getpid()
        existing.started_at, existing.heartbeat_at, existing.stopped_at = now, now, None
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


def claim_in_transaction(runner_id: str) -> Claim:
    """Take the oldest queued run, with the columns of its session and project that starting it reads.

    Inside the caller's atomic() the claim commits (or not) with what follows it; alone, on
    PostgreSQL it is one statement that commits by itself. `more` lets a runner that took
    the only queued run skip asking again at once, beside the new turn's prompt. On
    PostgreSQL the second run stays locked until this transaction ends, and the caller
    claims it next; a caller at capacity leaves it to the other runners' next poll.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_claim_statement(), _claim_params(runner_id))
            return _claim_result(cursor.fetchone())
    with transaction.atomic(savepoint=False):
        # SQLite: IMMEDIATE transactions serialise writers, so a read then an update is safe.
        found = list(
            Run.objects.filter(status=RunStatus.QUEUED)
            .select_related("session__project")
            .order_by("created_at", "id")[:2]
        )
        if not found:
            return NOTHING
        run, more = found[0], len(found) > 1
        claimed = Run.objects.filter(pk=run.pk, status=RunStatus.QUEUED).update(
            status=RunStatus.RUNNING,
            lease_owner=runner_id,
            lease_expires_at=_lease_until(),
            started_at=timezone.now(),
        )
        return Claim(ClaimedRun.of(run) if claimed else None, more)


async def aclaim_postgres(
    conn: psycopg.AsyncConnection[Any], runner_id: str, now: datetime | None = None
) -> Claim:
    """claim_in_transaction's PostgreSQL statement on the runner's own connection, in its event
    loop (autocommit): no hop to a database thread and back on the way to a first token."""
    async with conn.cursor() as cursor:
        await cursor.execute(_claim_statement(), _claim_params(runner_id, now))
        return _claim_result(await cursor.fetchone())


def _claim_params(runner_id: str, now: datetime | None = None) -> list[Any]:
    """`now` becomes the claimed run's started_at: it names the claim (unstarted_claims)."""
    queued, running = str(RunStatus.QUEUED), str(RunStatus.RUNNING)
    return [queued, running, runner_id, _lease_until(), now or timezone.now(), queued]


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
    """Lock the two oldest queued runs (SKIP LOCKED), claim the first, return it with its session's
    and project's columns and the count: one round trip where ORM reads and an update were five."""
    quote = connection.ops.quote_name
    run, session, project = (quote(model._meta.db_table) for model in (Run, Session, Project))
    return (
        # MATERIALIZED: the two rows are locked once and both readers see the same two.
        f"WITH next AS MATERIALIZED (SELECT id, created_at FROM {run} WHERE status = %s "
        "ORDER BY created_at, id LIMIT 2 FOR UPDATE SKIP LOCKED), "
        f"claimed AS (UPDATE {run} SET status = %s, lease_owner = %s, lease_expires_at = %s, "
        "started_at = %s WHERE id = (SELECT id FROM next ORDER BY created_at, id LIMIT 1) "
        "AND status = %s RETURNING id, source, prompt_text, session_id, last_seq, attachments) "
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
