"""The process tree under a process this test started, read from /proc (Linux; no psutil).

Used to find the agent processes a runner spawned, so a test can kill exactly one of them by
pid — never by name.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")


def _parent(pid: int) -> int | None:
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # `pid (comm) state ppid …`: comm may hold spaces and parentheses, so split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[1])


def cmdline(pid: int) -> list[str]:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def children(pid: int) -> list[int]:
    """The live direct children of `pid`."""
    found = []
    for entry in PROC.iterdir():
        if entry.name.isdigit() and _parent(int(entry.name)) == pid:
            found.append(int(entry.name))
    return sorted(found)


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children(todo.pop()):
            out.append(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for its parent."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


def agent_pids(runner_pid: int, marker: str) -> list[int]:
    """Direct children of the runner whose command line contains `marker` (e.g. `runs.demo_agent`)."""
    return [pid for pid in children(runner_pid) if any(marker in part for part in cmdline(pid))]


def is_ours(pid: int, ancestor: int) -> bool:
    """Whether `pid` descends from `ancestor` (a process this test started)."""
    seen = 0
    current: int | None = pid
    while current and seen < 64:
        if current == ancestor:
            return True
        current = _parent(current)
        seen += 1
    return False


def kill9(pid: int, ancestor: int) -> None:
    """SIGKILL `pid`, refusing one that does not descend from `ancestor`."""
    assert is_ours(pid, ancestor), f"pid {pid} is not under {ancestor}: not ours to kill"
    os.kill(pid, 9)
