"""Helpers for tests of the runner's insides (runs/runner/): claims, executions, the writer's threads."""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any

from django.db import connections, transaction

from runs.models import Run
from runs.runner import leases, writer
from runs.runner.agents import AgentProcess
from runs.runner.claims import run_context
from runs.runner.execution import RunExecution
from runs.runner.leases import ClaimedRun


def claim_next(runner_id: str) -> int | None:
    """Take the oldest queued run in a transaction of its own, as a runner would: its id, or None."""
    with transaction.atomic():
        claimed = leases.claim_in_transaction(runner_id).run
    return claimed.run_id if claimed is not None else None


class IdlePool:
    """An agent pool that lends nothing and records what it is given back."""

    def __init__(self) -> None:
        self.released: list[Any] = []

    async def acquire(self, spec: Any, project_id: int, cwd: str) -> AgentProcess:
        raise AssertionError("this test's execution starts no agent")

    async def release(self, process: AgentProcess) -> None:
        self.released.append(process)


@dataclass
class StubHost:
    """An ExecutionHost that counts what the execution asks of its runner."""

    runner_id: str = "r-test"
    pool: Any = field(default_factory=IdlePool)
    woken: int = 0
    pokes: int = 0

    def wake(self) -> None:
        self.woken += 1

    def poke_controls(self) -> None:
        self.pokes += 1


def execution_of(run: Run, host: StubHost | None = None) -> RunExecution:
    """An execution of `run`, as a runner that claimed it would start it."""
    return RunExecution(host or StubHost(), run_context(ClaimedRun.of(run)))


def close_writer_threads() -> None:
    """Close the journal writer threads' database connections, so a test database can be dropped.

    The writer gets fresh threads, which connect again at their first write.
    """
    old, writer.db_threads = writer.db_threads, writer.db_thread_pool()
    # One task per thread: the barrier holds each until all are running, so every thread gets one.
    barrier = threading.Barrier(writer.DB_THREADS)

    def close() -> None:
        barrier.wait(timeout=10)
        connections.close_all()

    for future in [old.submit(close) for _ in range(writer.DB_THREADS)]:
        with contextlib.suppress(Exception):
            future.result(timeout=15)
    old.shutdown(wait=True)
