"""Claiming queued runs, holding leases, reaping runs whose runner vanished.

Design note: docs/runner.md ("Leases and crashes"). A claim is a conditional
UPDATE (status still `queued`), taken with SKIP LOCKED on PostgreSQL so several
runners never wait on, or execute, the same run. A session never has two
active runs (a partial unique index), so turns are serialised per session
whatever the number of runners.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from runs.models import Run, Runner, RunStatus
from runs.services import do_mark_interrupted


def _lease_until() -> timezone.datetime:
    return timezone.now() + timedelta(seconds=settings.HERMESWEB_LEASE_SECONDS)


def register_runner(runner_id: str) -> Runner:
    return Runner.objects.create(id=runner_id, host=socket.gethostname(), pid=os.getpid())


def heartbeat(runner_id: str, capabilities: dict | None = None) -> None:
    fields: dict = {"heartbeat_at": timezone.now()}
    if capabilities is not None:
        fields["agent_capabilities"] = capabilities
    Runner.objects.filter(pk=runner_id).update(**fields)


def mark_stopped(runner_id: str) -> None:
    Runner.objects.filter(pk=runner_id).update(stopped_at=timezone.now())


def claim_next(runner_id: str) -> int | None:
    """Take the oldest queued run, or None. Safe with any number of runners."""
    with transaction.atomic():
        run, _ = claim_in_transaction(runner_id)
        return run.pk if run is not None else None


def claim_in_transaction(runner_id: str) -> tuple[Run | None, bool]:
    """claim_next inside the caller's atomic(): the claim commits (or not) with what follows it.

    The run comes with its session and project, what starting it reads. Also says
    whether another queued run was there to take: a runner that claimed the
    only one need not ask again at once. (That empty claim ran beside the new turn's
    prompt and cost its first token ~3 ms: bench/README.md, ttft.) On PostgreSQL the
    second run stays locked until this transaction ends, and the caller claims it next; a
    caller at capacity leaves it to the other runners' next poll.
    """
    with transaction.atomic(savepoint=False):
        candidates = (
            Run.objects.filter(status=RunStatus.QUEUED)
            .select_related("session__project")
            .order_by("created_at", "id")
        )
        if connection.vendor == "postgresql":
            candidates = candidates.select_for_update(skip_locked=True, of=("self",))
        found = list(candidates[:2])
        if not found:
            return None, False
        run, more = found[0], len(found) > 1
        now = timezone.now()
        claimed = Run.objects.filter(pk=run.pk, status=RunStatus.QUEUED).update(
            status=RunStatus.RUNNING, lease_owner=runner_id, lease_expires_at=_lease_until(), started_at=now
        )
        return (run if claimed else None), more


def renew_leases(runner_id: str, run_ids: list[int]) -> set[int]:
    """Extend our leases; returns the runs we still hold (a reaper may have taken some)."""
    held = Run.objects.executing().filter(pk__in=run_ids, lease_owner=runner_id)
    held.update(lease_expires_at=_lease_until())
    return set(held.values_list("pk", flat=True))


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
