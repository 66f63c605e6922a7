"""The runner process: claims queued runs and executes them on agents.

Design note: docs/runner.md ("The package"). Loops, all on one asyncio event loop:
- claim: take queued runs (SKIP LOCKED on PostgreSQL) while below capacity;
- leases: heartbeat, renew our leases, drop runs someone else reaped;
- reaper: interrupt runs whose runner vanished (never re-prompt them);
- controls: apply pending Control rows of the runs we hold;
- idle: stop agent processes nobody used for a while, or past the memory budget (memory.py);
- warm: start a session's agent before its turn when its page asks (warm.py);
- housekeeping: remove uploads no message named within a day (runs.attachments.remove_unsent);
- jobs: session discovery and import (runs/runner/jobs.py).
Executions and the job loop see this process through narrow interfaces
(execution.ExecutionHost, jobs.JobHost), never as a whole.
A doorbell only shortens the waits — PostgreSQL's LISTEN/NOTIFY, else the
channel layer with Redis — and every loop also polls the database, so a lost
notification costs latency, never correctness.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import uuid
from collections.abc import Coroutine
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.utils import timezone

from automations import scheduler as automations
from runs import attachments, notify
from runs.models import Control, Run
from runs.runner import connections, leases, memory
from runs.runner.agents import AgentPool, AgentProcess
from runs.runner.claims import Claimed, aclaim_run, claim_run, unstarted_runs
from runs.runner.connections import LoopConnection, revived
from runs.runner.execution import RunExecution
from runs.runner.jobs import JobLoop
from runs.runner.session_rows import store_between_turns
from runs.runner.translate import Translator
from runs.runner.warm import Warmer
from runs.runner.writer import group_commit
from runs.turns import do_mark_interrupted

log = logging.getLogger(__name__)

# After a claim that failed on its connection, the next try comes this soon at the latest: a
# claim that committed unanswered has taken a run only this runner can start.
CLAIM_RETRY_SECONDS = 0.5
# Housekeeping (unsent attachments past their day) runs at start, then this often.
HOUSEKEEPING_SECONDS = 600.0


class Failing:
    """A loop's failures, logged once per outage (with the first traceback) and its recovery.

    During a database restart every loop fails at every turn: at the poll interval that was
    a traceback per loop five times a second, burying the one line that says what happened.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self.since: float | None = None

    def failed(self) -> None:
        """Call in the `except` block."""
        if self.since is None:
            self.since = asyncio.get_running_loop().time()
            log.warning("%s failed; trying again quietly until it works", self.what, exc_info=True)
        else:
            log.debug("%s failed again", self.what, exc_info=True)

    def worked(self) -> None:
        if self.since is not None:
            took = asyncio.get_running_loop().time() - self.since
            log.warning("%s works again, after %.1f s", self.what, took)
            self.since = None


class RunnerProcess:
    """One runner: its loops, its agent processes and the executions of the runs it holds."""

    def __init__(self, runner_id: str | None = None) -> None:
        self.runner_id = runner_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.pool = AgentPool()
        self.pool.on_started = self._agent_started
        self.pool.on_orphan_update = self._orphan_update
        self.executions: dict[int, RunExecution] = {}
        self.warmer = Warmer(
            self.pool, settings.HERMESWEB_RUNNER_POLL_SECONDS, settings.HERMESWEB_WARM_INTERVAL_SECONDS
        )
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.capabilities: dict[str, Any] = {}
        self.stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._controls_wake = asyncio.Event()
        self._background: set[asyncio.Task[Any]] = set()
        self._claim_conn = LoopConnection()  # PostgreSQL: claims from this loop (claims.aclaim_run)
        self.poll = settings.HERMESWEB_RUNNER_POLL_SECONDS
        self.lease = settings.HERMESWEB_LEASE_SECONDS
        self._claims = Failing("claiming")
        # When each claim that failed was sent: it may have taken a run (its started_at).
        self._claims_in_doubt: list[datetime] = []
        self._leases = Failing("the lease loop")
        self._controls = Failing("reading controls")
        self._housekeeping_at = 0.0

    def wake(self) -> None:
        """Claim now, and read controls now."""
        self._wake.set()
        self._controls_wake.set()

    def wake_for(self, reason: str) -> None:
        """Wake only the loop a doorbell's reason (notify.wake_runners) is for: a new turn's ring
        must not send the control loop to the database beside the claim, on the first token's path."""
        kind = reason.partition(":")[0]
        if kind == "run.queued":
            self._wake.set()
        elif kind == "control":
            self._controls_wake.set()
        elif kind == "warm":
            self.warmer.wake()
        else:
            self.wake()

    def poke_controls(self) -> None:
        """Read controls now."""
        self._controls_wake.set()

    async def run(self) -> None:
        await sync_to_async(leases.register_runner)(self.runner_id)
        log.info("runner %s started (pid %s)", self.runner_id, os.getpid())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.stopping.set)
        await self._reap()
        journal_group = group_commit()
        journal_group.write_from_loop()
        loops = [
            asyncio.ensure_future(self._claim_loop()),
            asyncio.ensure_future(self._lease_loop()),
            asyncio.ensure_future(self._control_loop()),
            asyncio.ensure_future(self._doorbell_loop()),
            asyncio.ensure_future(JobLoop(self).run()),
            asyncio.ensure_future(self.warmer.run(self.stopping, doorbell=self._has_doorbell())),
            # Triggers' planned times (docs/automations.md): the database decides which runner fires.
            asyncio.ensure_future(automations.run(self.stopping, self.runner_id, revived)),
        ]
        await self.stopping.wait()
        log.info("runner %s stopping: no new claims; %d turn(s) finishing", self.runner_id, len(self.tasks))
        loops[0].cancel()
        await self._claim_conn.discard()
        await self._drain(settings.HERMESWEB_SHUTDOWN_GRACE_SECONDS)
        for task in loops:
            task.cancel()
        await self.warmer.close()
        await self.pool.close_all()
        await journal_group.close()
        await sync_to_async(leases.mark_stopped)(self.runner_id)
        log.info("runner %s stopped", self.runner_id)

    async def _drain(self, grace: float) -> None:
        """Let running turns finish up to `grace` seconds, then interrupt what remains."""
        if self.tasks:
            await asyncio.wait(list(self.tasks.values()), timeout=grace)
        for run_id, execution in list(self.executions.items()):
            run = await sync_to_async(Run.objects.get)(pk=run_id)
            await sync_to_async(do_mark_interrupted)(
                run, f"runner {self.runner_id} shut down before the turn finished", code="runner_shutdown"
            )
            execution.abort("runner shutdown")
        if self.tasks:
            await asyncio.wait(list(self.tasks.values()), timeout=10)

    # ----------------------------------------------------------------- loops

    async def _claim_loop(self) -> None:
        # Claims again at once only while queued runs remain; otherwise a doorbell (or the
        # poll) wakes it.
        while not self.stopping.is_set():
            claimed = False
            try:
                if len(self.tasks) < settings.HERMESWEB_MAX_RUNS_PER_RUNNER:
                    started = await self._claim()
                    if started is not None:
                        self._start(started)
                        claimed = started.more
                self._claims.worked()
            except Exception:
                # A failed claim must not end the loop: the runner would look alive and never
                # claim again. The next poll tries again (its connection revived).
                self._claims.failed()
            if not claimed:
                wait = min(self.poll, CLAIM_RETRY_SECONDS) if self._claims_in_doubt else self.poll
                await self._sleep(self._wake, wait)

    async def _claim(self) -> Claimed | None:
        if not notify.runners_listen():
            return await sync_to_async(revived(claim_run))(self.runner_id)
        # PostgreSQL: on a connection of our own, in this loop.
        now = timezone.now()
        try:
            conn = await self._claim_conn.get()
            if self._claims_in_doubt:
                await self._start_unstarted_claims()
            return await aclaim_run(self.runner_id, conn, now)
        except Exception:
            # The claim may have committed with its answer lost: before claiming again, the
            # next try starts any run it took (_start_unstarted_claims). Otherwise that run
            # would wait, claimed and never started, for the reaper to mark it interrupted.
            self._claims_in_doubt.append(now)
            await self._claim_conn.discard()
            raise

    async def _start_unstarted_claims(self) -> None:
        doubted = list(self._claims_in_doubt)
        found = await sync_to_async(revived(unstarted_runs))(self.runner_id, doubted, list(self.executions))
        for claimed in found:
            log.warning("run %s: taken by a claim whose answer was lost; starting it", claimed.context.run_id)
            self._start(claimed)
        del self._claims_in_doubt[: len(doubted)]

    def _start(self, claimed: Claimed) -> None:
        execution = RunExecution(self, claimed.context)
        run_id = execution.run_id
        self.executions[run_id] = execution
        task = asyncio.ensure_future(execution.execute())
        self.tasks[run_id] = task

        def done(_: asyncio.Task[None]) -> None:
            self.executions.pop(run_id, None)
            self.tasks.pop(run_id, None)
            self._wake.set()

        task.add_done_callback(done)

    async def _lease_loop(self) -> None:
        interval = max(self.lease / 3, 0.2)
        while True:
            try:
                await sync_to_async(revived(leases.heartbeat))(self.runner_id, self.capabilities)
                held = list(self.executions)
                if held:
                    still = await sync_to_async(leases.renew_leases)(self.runner_id, held)
                    for run_id in set(held) - still:
                        execution = self.executions.get(run_id)
                        if execution is not None and run_id in self.executions:
                            execution.abort("lease lost")
                await self._reap()
                await self.pool.reap_idle(settings.HERMESWEB_AGENT_IDLE_SECONDS)
                await memory.enforce(self.pool, settings.HERMESWEB_AGENT_MEMORY_MB)
                await self._housekeeping()
                self._leases.worked()
            except Exception:
                self._leases.failed()
            await asyncio.sleep(interval)

    async def _housekeeping(self) -> None:
        now = asyncio.get_running_loop().time()
        if now < self._housekeeping_at:
            return
        self._housekeeping_at = now + HOUSEKEEPING_SECONDS
        removed = await sync_to_async(attachments.remove_unsent)()
        if removed:
            log.info("removed %d unsent attachment(s) past their day", removed)

    async def _reap(self) -> None:
        reaped = await sync_to_async(leases.reap_stale)(self.runner_id)
        if reaped:
            log.warning("interrupted runs left by vanished runners: %s", reaped)
            self._wake.set()

    async def _control_loop(self) -> None:
        while True:
            try:
                if self.executions:
                    controls = await sync_to_async(revived(_pending_controls))(list(self.executions))
                    for control in controls:
                        execution = self.executions.get(control.run_id)
                        if execution is not None:
                            execution.start_control(control)
                self._controls.worked()
            except Exception:
                self._controls.failed()
            await self._sleep(self._controls_wake, self.poll)

    @staticmethod
    def _has_doorbell() -> bool:
        return notify.runners_listen() or bool(settings.REDIS_URL)

    async def _doorbell_loop(self) -> None:
        """Wake the loops when work is written: PostgreSQL's NOTIFY, else with Redis the channel layer."""
        if notify.runners_listen():
            listen = self._listen_postgres
        elif settings.REDIS_URL:
            listen = self._listen_channel_layer
        else:
            return  # the embedded default: one machine, the poll alone
        while True:
            try:
                await listen()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("doorbell subscription failed; polling only for a while", exc_info=True)
                await asyncio.sleep(5)

    async def _listen_postgres(self) -> None:
        # Its own connection in this loop: a notification wakes the claim without a thread hop.
        async with await connections.connect() as conn:
            await conn.execute(f"LISTEN {notify.RUNNERS_CHANNEL}")
            self.wake()  # whatever was written while nobody listened
            async for note in conn.notifies():
                self.wake_for(note.payload)

    async def _listen_channel_layer(self) -> None:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(notify.RUNNERS_GROUP, channel)
        while True:
            message = await layer.receive(channel)
            self.wake_for(str(message.get("reason") or ""))

    @staticmethod
    async def _sleep(event: asyncio.Event, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout)
        event.clear()

    # -------------------------------------------------------- agent hooks

    async def _agent_started(self, process: AgentProcess) -> None:
        self.capabilities[process.spec.name] = process.capabilities
        # A new process is when the budget is passed: idle ones make room now, not at the next lease.
        self._in_background(memory.enforce(self.pool, settings.HERMESWEB_AGENT_MEMORY_MB))
        await sync_to_async(leases.heartbeat)(self.runner_id, self.capabilities)

    def _orphan_update(self, process: AgentProcess, session_id: str, update: Any) -> None:
        """Updates after a turn ended (Hermes sends its title and commands late): keep them."""
        translator = Translator()
        translator.translate(update)
        if translator.commands is None and not translator.title:
            return
        if translator.commands is not None:
            # Written here only if a session already holds this agent session id (not yet, during
            # session/new): the next run of it compares its commands with nothing and writes them.
            process.stored_commands.pop(session_id, None)
        store = sync_to_async(store_between_turns)
        self._in_background(store(session_id, translator.title, translator.commands))

    def _in_background(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)


def _pending_controls(run_ids: list[int]) -> list[Control]:
    return list(Control.objects.pending().filter(run_id__in=run_ids).order_by("created_at", "id"))
