"""The agents' memory budget: idle agent processes stopped past HERMESWEB_AGENT_MEMORY_MB.

Design note: docs/runner.md ("Warm-up and memory"). Each agent process counts the resident set
of its whole tree (bwrap, the network bridge, the agent and what it started), read from /proc
in one pass. Past the budget, idle processes are stopped least recently used first until the
total fits; a process with a turn (or a warm-up) holding it is never stopped, even if the
budget cannot be met without it. Resident sets count shared pages once per process, so the
total overstates a little: the budget errs towards stopping early.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path

from runs.runner.agents import AgentPool

log = logging.getLogger(__name__)

PROC = Path("/proc")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class AgentUse:
    """One agent process as the budget sees it."""

    key: Hashable
    rss_bytes: int
    last_used: float
    active: bool


def _stat(pid: str) -> tuple[int, int] | None:
    """(ppid, resident bytes) of a live process, None if it is gone."""
    try:
        stat = (PROC / pid / "stat").read_text()
        statm = (PROC / pid / "statm").read_text()
    except OSError:
        return None
    # `pid (comm) state ppid …`: comm may hold spaces and parentheses.
    ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
    return ppid, int(statm.split()[1]) * PAGE_BYTES


def tree_rss(roots: Sequence[int]) -> dict[int, int]:
    """Resident bytes of each root's process tree (the root and all its descendants)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        found = _stat(entry.name)
        if found is not None:
            pid = int(entry.name)
            children.setdefault(found[0], []).append(pid)
            rss[pid] = found[1]
    totals: dict[int, int] = {}
    for root in roots:
        total, todo, seen = 0, [root], set()
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            total += rss.get(pid, 0)
            todo.extend(children.get(pid, ()))
        totals[root] = total
    return totals


def over_budget(uses: Sequence[AgentUse], budget_bytes: int) -> list[Hashable]:
    """The idle processes to stop, least recently used first, until the total fits the budget."""
    total = sum(use.rss_bytes for use in uses)
    victims: list[Hashable] = []
    for use in sorted((u for u in uses if not u.active), key=lambda u: u.last_used):
        if total <= budget_bytes:
            break
        victims.append(use.key)
        total -= use.rss_bytes
    return victims


async def enforce(pool: AgentPool, budget_mb: int) -> int:
    """Stop idle agent processes of `pool` past `budget_mb` (0: no budget); how many were stopped."""
    if budget_mb <= 0:
        return 0
    processes = {key: p for key, p in pool.processes.items() if p.process is not None and p.alive}
    if not processes:
        return 0
    pids = {key: p.process.pid for key, p in processes.items() if p.process is not None}
    sizes = await asyncio.to_thread(tree_rss, list(pids.values()))
    uses = [AgentUse(key, sizes.get(pids[key], 0), p.last_used, p.active > 0) for key, p in processes.items()]
    stopped = 0
    for key in over_budget(uses, budget_mb * 1024 * 1024):
        process = processes[key]
        # Checked again as it is stopped: a turn may have taken it while /proc was read.
        if await pool.retire_idle(process):
            stopped += 1
            log.info(
                "agent %s for project %s stopped: past the memory budget (%d MB)",
                process.spec.name,
                process.project_id,
                budget_mb,
            )
    return stopped
