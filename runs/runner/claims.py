"""What a claim hands to an execution: the claimed run, and the usage baseline of its agent.

Design note: docs/runner.md ("Claiming and serialising"). runs/runner/leases.py takes the
run (one statement on PostgreSQL); this module adds what executing it needs beyond the
claimed row and is what the runner process calls to claim.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from asgiref.sync import sync_to_async
from django.conf import settings

from projects.models import Session
from runs.models import Run
from runs.runner import leases
from runs.runner.leases import ClaimedRun

if TYPE_CHECKING:
    import psycopg


@dataclass(frozen=True)
class RunContext(ClaimedRun):
    """A claimed run with what executing it needs beyond its row."""

    # The agent reports a running session total (Hermes): a turn's usage is the difference
    # with the total the session's previous turn ended with (`previous_usage_total`, read at
    # the turn's end: it cannot change meanwhile, and the first token need not wait for it).
    cumulative_usage: bool = False
    # The parent's agent session to fork (session/fork) on this forked session's first turn.
    fork_agent_session_id: str = ""


class Claimed(NamedTuple):
    """A run this runner took, ready to execute."""

    context: RunContext
    more: bool = False  # another queued run was seen: claim again at once


def claim_run(runner_id: str) -> Claimed | None:
    """Claim the oldest queued run and read what executing it needs; on PostgreSQL one statement.

    The claim commits before the agent is prompted. `run.started` is the execution's first
    event, written by the run's writer while the agent is prompted rather than in the
    claim's transaction, a commit fewer before the first token; a runner that dies before
    writing it leaves a claimed run that the reaper marks interrupted, like any other.
    """
    claim = leases.claim_in_transaction(runner_id)
    if claim.run is None:
        return None
    return Claimed(run_context(claim.run), claim.more)


async def aclaim_run(
    runner_id: str, conn: psycopg.AsyncConnection[Any], now: datetime | None = None
) -> Claimed | None:
    """claim_run on PostgreSQL on the runner's own connection, without leaving its event loop."""
    claim = await leases.aclaim_postgres(conn, runner_id, now)
    if claim.run is None:
        return None
    fork = await sync_to_async(_fork_source)(claim.run) if not claim.run.agent_session_id else ""
    return Claimed(_context(claim.run, fork), claim.more)


def unstarted_runs(
    runner_id: str, claimed_at: Collection[datetime], running: Collection[int]
) -> list[Claimed]:
    """The runs claims took whose answers never arrived, ready to start (leases.unstarted_claims)."""
    found = leases.unstarted_claims(runner_id, claimed_at, running)
    return [Claimed(run_context(claimed)) for claimed in found]


def run_context(claimed: ClaimedRun) -> RunContext:
    """`claimed` with what executing it needs (a read of the previous turn only if the agent needs it)."""
    fork = _fork_source(claimed) if not claimed.agent_session_id else ""
    return _context(claimed, fork)


def _context(claimed: ClaimedRun, fork: str = "") -> RunContext:
    return RunContext(
        **vars(claimed), cumulative_usage=_cumulative_usage(claimed), fork_agent_session_id=fork
    )


def _fork_source(claimed: ClaimedRun) -> str:
    """A session's first turn only: the parent agent session it forks, if it is a fork."""
    found = Session.objects.filter(pk=claimed.session_id).values_list("fork_agent_session_id", flat=True)
    return found.first() or ""


def _cumulative_usage(claimed: ClaimedRun) -> bool:
    spec = settings.HERMESWEB_AGENTS.get(claimed.agent)
    return bool(spec and spec.cumulative_usage)


def previous_usage_total(claimed: ClaimedRun) -> dict[str, Any] | None:
    """The session total the session's previous finished turn ended with (cumulative agents)."""
    previous = (
        Run.objects.filter(session_id=claimed.session_id, finished_at__isnull=False)
        .exclude(pk=claimed.run_id)
        .order_by("-finished_at")
        .first()
    )
    return (previous.usage or {}).get("session_total") if previous else None
