"""Warm agents: a session's agent started (and its session loaded) before the user's turn.

Design note: docs/runner.md ("Warm-up and memory"). The web writes a `WarmRequest` row when a
session's page is opened or typed in (runs/warm_requests.py) and rings the runners; the loop
here reads the rows (the doorbell wakes it, its poll finds them without one), takes each by
deleting it — so one runner warms a session — and then does what a turn would do first:
`AgentPool.acquire` (spawn, `initialize`) and `session/load`. The process stays in the pool,
where the turn's own `acquire` finds it; the loaded session is marked so the turn skips its load.

A hint only: a request older than WARM_TTL_SECONDS is dropped unread, a failure is logged and
forgotten (the turn meets it again and reports it), and a turn never waits for a warm-up except
a `session/load` already in flight for its own session (`settled`): loading it twice would
replay the history twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from dataclasses import dataclass
from datetime import datetime, timedelta

import acp
from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone

from runs import placement
from runs.models import ACTIVE_STATUSES, WarmRequest
from runs.runner.agents import AgentDied, AgentPool, AgentProcess, ProjectPathRefused
from runs.runner.connections import revived
from worktrees.models import WorktreeState

log = logging.getLogger(__name__)

# A request this old is about a page opened long ago (no runner was up): dropped, not warmed.
WARM_TTL_SECONDS = 60.0
# Requests read per poll; more wait for the next one.
BATCH = 50
# Hermes replays a long history on load; a turn's own load allows as much (execution.py).
LOAD_TIMEOUT = 120.0
# With a doorbell (NOTIFY, Redis) the poll is a backstop: a lost ring costs this much at most.
POLL_WITH_DOORBELL_SECONDS = 2.0

# Agent session loads a warm-up has in flight, per process: a turn of that session awaits its end.
_loading: weakref.WeakKeyDictionary[AgentProcess, dict[str, asyncio.Future[None]]] = (
    weakref.WeakKeyDictionary()
)


@dataclass(frozen=True)
class WarmTarget:
    """One request, with what warming its session needs (the claim's columns, read the same way)."""

    session_id: int
    requested_at: datetime
    project_id: int
    project_path: str  # what placement matches against the runner's roots
    cwd: str  # where its turns run: the project, or the session's ready worktree
    agent: str
    agent_session_id: str
    required_labels: list[str]


def pending_requests(now: datetime) -> list[WarmTarget]:
    """Requests younger than WARM_TTL_SECONDS of sessions with no turn under way, oldest first;
    older ones are deleted (a busy session's stays: its turn holds the agent, and it expires)."""
    WarmRequest.objects.filter(requested_at__lt=now - timedelta(seconds=WARM_TTL_SECONDS)).delete()
    rows = (
        WarmRequest.objects.exclude(session__runs__status__in=ACTIVE_STATUSES)
        .order_by("requested_at")
        .values_list(
            "session_id",
            "requested_at",
            "session__project_id",
            "session__project__path",
            "session__project__agent",
            "session__agent_session_id",
            "session__project__required_labels",
            "session__worktree__path",
            "session__worktree__state",
        )[:BATCH]
    )
    targets = []
    for sid, at, project_id, path, agent, agent_sid, labels, tree, tree_state in rows:
        if tree_state is not None and tree_state != WorktreeState.READY:
            continue  # its first turn makes the worktree; an agent started elsewhere would be wasted
        cwd = tree if tree_state is not None else path
        targets.append(WarmTarget(sid, at, project_id, path, cwd, agent, agent_sid, list(labels or [])))
    return targets


def take_request(target: WarmTarget) -> bool:
    """Take the request (delete it) unless another runner did, or the page asked again since."""
    return WarmRequest.objects.filter(pk=target.session_id, requested_at=target.requested_at).delete()[0] > 0


def serves(target: WarmTarget, offer: placement.Offer) -> bool:
    """Whether this runner would claim the session's turns: the claim's own placement rule
    (its labels and roots, docs/runner.md "Placement"); a request it would not is left to one
    that would. Among runners that all serve it, whichever takes the request warms it."""
    if target.agent not in settings.HERMESWEB_AGENTS:
        return False
    required = placement.required_labels(target.required_labels, target.agent)
    return offer.serves(target.project_path, required, target.agent)


async def settled(process: AgentProcess, agent_session_id: str) -> None:
    """Wait for a warm-up's `session/load` of this agent session in this process, if one is in flight."""
    future = _loading.get(process, {}).get(agent_session_id)
    if future is not None:
        with contextlib.suppress(Exception):
            await asyncio.shield(future)


class Warmer:
    """The runner's warm-up loop, and the warm-ups it runs."""

    def __init__(self, pool: AgentPool, poll: float, interval: float) -> None:
        self.pool = pool
        self.poll = poll
        self.interval = interval
        self.warmed = 0  # warm-ups done (a bench's and a test's counter)
        self._wake = asyncio.Event()
        self._recent: dict[int, float] = {}  # session id → when this runner last warmed it
        self._tasks: set[asyncio.Task[None]] = set()

    def wake(self) -> None:
        self._wake.set()

    async def run(self, stopping: asyncio.Event, doorbell: bool) -> None:
        poll = max(self.poll, POLL_WITH_DOORBELL_SECONDS) if doorbell else self.poll
        failing = False
        while not stopping.is_set():
            try:
                await self.once()
                failing = False
            except Exception:
                if not failing:  # once per outage: the claim loop says the database is away
                    log.warning("reading warm-up requests failed", exc_info=True)
                failing = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), poll)
            self._wake.clear()

    async def once(self) -> None:
        targets = await sync_to_async(revived(pending_requests))(timezone.now())
        offer = placement.this_runner()
        for target in targets:
            if not serves(target, offer):
                continue  # left for a runner that would run its turns; it expires otherwise
            if not await sync_to_async(revived(take_request))(target):
                continue
            if not self._first_in(target.session_id):
                continue  # warmed here within the interval: the page asked again
            task = asyncio.ensure_future(self.warm(target))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _first_in(self, session_id: int) -> bool:
        now = time.monotonic()
        for known, at in list(self._recent.items()):
            if now - at >= self.interval:
                del self._recent[known]
        if session_id in self._recent:
            return False
        self._recent[session_id] = now
        return True

    async def warm(self, target: WarmTarget) -> None:
        spec = settings.HERMESWEB_AGENTS.get(target.agent)
        if spec is None:
            return
        try:
            process = await self.pool.acquire(spec, target.project_id, target.cwd)
        except (AgentDied, ProjectPathRefused) as exc:
            log.info("session %s: no warm-up (%s)", target.session_id, exc)
            return
        try:
            await load_session(process, target)
            self.warmed += 1
            log.info("session %s: agent %s ready (pid %s)", target.session_id, spec.name, process.process.pid)
        except (AgentDied, acp.RequestError, TimeoutError) as exc:
            log.info(
                "session %s: warm-up's session/load failed (%r); its turn loads it", target.session_id, exc
            )
        finally:
            await self.pool.release(process)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=10)


async def load_session(process: AgentProcess, target: WarmTarget) -> None:
    """`session/load` the target's agent session in `process` unless it is loaded or loading there.

    A session the agent never opened (no turn yet) has nothing to load: the spawn is the warm-up.
    """
    sid = target.agent_session_id
    if (
        not sid
        or sid in process.loaded
        or sid in process.loading
        or not process.capabilities.get("load_session")
    ):
        return
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    _loading.setdefault(process, {})[sid] = future
    process.loading.add(sid)  # the replayed history is dropped, as for a turn's load
    try:
        await process.call(
            process.conn.load_session(cwd=target.cwd, session_id=sid, mcp_servers=[]), LOAD_TIMEOUT
        )
        process.loaded.add(sid)
    finally:
        process.loading.discard(sid)
        _loading.get(process, {}).pop(sid, None)
        future.set_result(None)
