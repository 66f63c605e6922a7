"""One run executing on an agent: open the session, prompt, stream, apply controls, end the turn.

Design note: docs/runner.md ("The package", "Controls"). The execution is the only writer
of its run's journal while it holds the lease. It sees the runner that started it through
`ExecutionHost`; the agent's permission requests and elicitations, answered from controls,
are runs/runner/agent_requests.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import acp
from acp import schema
from asgiref.sync import sync_to_async
from django.conf import settings

from intents import services as intents
from runs.controls import record_result
from runs.journal import AlreadyTerminal, NewEvent, done_event
from runs.journal.payloads import Error, Progress, RunStarted, Status, SteerDelivered, UsageFinal
from runs.models import Control, ControlKind, EventType, RunStatus
from runs.runner import prompt_content, session_config, warm
from runs.runner.agent_requests import AgentRequests
from runs.runner.agents import AgentDied, AgentProcess, Agents, ProjectPathRefused
from runs.runner.claims import RunContext, previous_usage_total
from runs.runner.connections import retried
from runs.runner.forking import forked_context
from runs.runner.session_rows import store_agent_session, store_current_mode, store_session_meta
from runs.runner.translate import Translator, as_dict, per_turn_usage
from runs.runner.writer import JournalWriter
from workspace.checkpoints import RunCheckpoints
from worktrees import trees

log = logging.getLogger(__name__)

# Acknowledgements agents print for a `/steer` prompt; they belong to the steer, not the turn.
STEER_ACKS = ("Steer queued",)
CANCEL_TIMEOUT = "cancel not acknowledged"
# A flush of this run's events could not be written, nor shown to have landed, before
# HERMESWEB_DB_RETRY_SECONDS ran out (the writer's exactly-once write): the turn has a hole.
JOURNAL_LOST = "journal write lost"
JOURNAL_LOST_MESSAGE = (
    "The database could not be reached for too long while part of this turn was being saved, "
    "so that part may be missing. The turn was stopped; send the message again to redo it."
)


class ExecutionHost(Protocol):
    """What an execution uses of the runner that started it (RunnerProcess, runs/runner/process.py)."""

    @property
    def runner_id(self) -> str: ...

    @property
    def pool(self) -> Agents: ...

    def wake(self) -> None:
        """The turn ended: its session's next turn (a drained queue item) may be queued."""

    def poke_controls(self) -> None:
        """A request was journaled: read the controls now, its answer may already be there."""


class RunAborted(Exception):
    """The lease was lost (another runner reaped the run) or the runner is stopping."""


def _started_event(context: RunContext, runner_id: str) -> NewEvent:
    return NewEvent(
        EventType.RUN_STARTED,
        RunStarted(
            status=RunStatus.RUNNING,
            session_id=context.session_id,
            agent=context.agent,
            project=context.project_name,
            workspace=context.cwd,
            model=context.model or None,
            mode=context.mode or None,
            runner=runner_id,
            source=context.source,
        ),
    )


class RunExecution:
    """A claimed run from its first event to its terminal one; the agent session's sink meanwhile."""

    def __init__(self, host: ExecutionHost, context: RunContext) -> None:
        self.host = host
        self.context = context
        self.run_id = context.run_id
        self.writer = JournalWriter(self.run_id, last_seq=context.last_seq)
        self.writer.on_lost = lambda _: self.abort(JOURNAL_LOST)
        self.translator = Translator()
        self.process: AgentProcess | None = None
        self.agent_session_id = ""
        self.cancel_requested = asyncio.Event()
        self.requests = AgentRequests(self.writer, self.cancel_requested, host.poke_controls)
        self.aborted = asyncio.Event()
        self.abort_reason = ""
        self.steers_in_flight = 0
        self.turn_over = False
        self.prompt_sent = asyncio.Event()
        self.applying: set[int] = set()  # controls being applied
        self._tasks: set[asyncio.Task[Any]] = set()
        # The project's tree at the run's start and end (docs/workspace.md).
        self.checkpoints = RunCheckpoints(
            run_id=context.run_id,
            session_id=context.session_id,
            project_id=context.project_id,
            cwd=context.cwd,
        )

    # ------------------------------------------------------------------ main

    async def execute(self) -> None:
        try:
            await self._execute()
        except (AlreadyTerminal, RunAborted) as exc:
            # Whoever took the run (a reaper, our own shutdown) wrote its terminal event.
            log.warning("run %s stopped executing here: %r", self.run_id, exc)
        except Exception:
            log.exception("run %s crashed in the runner", self.run_id)
            await self._finish_safely(
                [
                    NewEvent(
                        EventType.ERROR,
                        Error(code="runner_error", message="The runner hit an internal error."),
                    ),
                    done_event(RunStatus.FAILED, reason="runner error"),
                ],
                error="runner internal error",
            )
        finally:
            for task in list(self._tasks):
                task.cancel()
            await self.release_agent()

    async def release_agent(self) -> None:
        """Leave the agent session, if its registration is still ours, and give the process back."""
        if self.process is None:
            return
        # Only our own: the session's next turn (a drained queue item) may already have
        # been claimed and have registered itself for the same agent session.
        if self.process.sinks.get(self.agent_session_id) is self:
            del self.process.sinks[self.agent_session_id]
            self.process.terminals.release_session(self.agent_session_id)  # the turn's terminals end with it
        self.process.runs.discard(self.run_id)
        await self.host.pool.release(self.process)

    async def _execute(self) -> None:
        refused = await self._enter_worktree()
        # Written while the agent is prompted; first of the run's events, as the writer keeps order.
        self.writer.add([_started_event(self.context, self.host.runner_id)])
        if refused is not None:  # never run in the main checkout instead
            await self._fail(refused.code, refused.message)
            return
        self.checkpoints.begin()  # beside the agent's start: not in the first token's way
        spec = settings.HERMESWEB_AGENTS.get(self.context.agent)
        if spec is None:
            await self._fail(
                "agent_unknown", f"Agent {self.context.agent!r} is not configured on this runner."
            )
            return
        try:
            self.process = await self.host.pool.acquire(spec, self.context.project_id, self.context.cwd)
            self.process.runs.add(self.run_id)
            await self._open_session()
        except ProjectPathRefused as exc:  # never started: the directory fails the path rules now
            await self._fail(exc.code, exc.message)
            return
        except AgentDied as exc:
            await self._fail("agent_start_failed", str(exc))
            return
        except acp.RequestError as exc:
            await self._fail("agent_session_failed", f"The agent refused to open the session: {exc}")
            return
        if self.cancel_requested.is_set():
            await self._finish_cancelled("cancelled before the prompt was sent")
            return
        # The session's chosen mode and model reach the agent before its turn (session_config.py).
        refused = await session_config.prepare_turn(self.process, self.agent_session_id, self.context)
        if refused is not None:
            await self._fail(refused.code, refused.message)
            return
        # Taken before the agent can edit: waited for here, begun beside its start.
        if notice := await self.checkpoints.before_prompt():
            self.writer.add([NewEvent(EventType.PROGRESS, Progress(text=notice))])
        await self._prompt()

    async def _enter_worktree(self) -> trees.WorktreeUnavailable | None:
        """A worktree session's turn works in its worktree, made now if new (docs/worktrees.md)."""
        try:
            row = await retried(trees.turn_tree, self.context.session_id)
            if row is None:
                return None
            await retried(trees.record_tree, row, await asyncio.to_thread(trees.prepare_tree, row))
        except trees.WorktreeUnavailable as exc:
            return exc
        self.context = dataclasses.replace(self.context, cwd=row.path)
        self.checkpoints.cwd = row.path
        return None

    async def _open_session(self) -> None:
        assert self.process is not None
        if self.context.fork_agent_session_id:  # a fork's first turn: session/fork (runs/runner/forking.py)
            self.context = await forked_context(self.process, self.context, self.writer)
        process, sid = self.process, self.context.agent_session_id
        if sid:
            await warm.settled(process, sid)  # a warm-up loading this session: not loaded twice
        if sid and sid in process.loaded:
            self.agent_session_id = sid
        elif sid and process.capabilities.get("load_session"):
            # A runner or agent restart: reopen. The replayed history is dropped (the journal has it).
            process.loading.add(sid)
            try:
                await process.call(
                    process.conn.load_session(cwd=self.context.cwd, session_id=sid, mcp_servers=[]), 120
                )
            finally:
                process.loading.discard(sid)
            process.loaded.add(sid)
            self.agent_session_id = sid
        else:
            if sid:
                self.writer.add(
                    [
                        NewEvent(
                            EventType.PROGRESS,
                            Progress(text="The agent cannot reload sessions; starting a new one."),
                        )
                    ]
                )
            response = await process.call(process.conn.new_session(cwd=self.context.cwd, mcp_servers=[]), 120)
            self.agent_session_id = response.session_id
            process.loaded.add(self.agent_session_id)
            await retried(store_agent_session, self.context.session_id, self.agent_session_id)
        process.sinks[self.agent_session_id] = self
        if self.agent_session_id in process.commands:
            self.on_update(process.commands[self.agent_session_id])

    async def _prompt(self) -> None:
        assert self.process is not None
        process = self.process
        blocks = await prompt_content.prompt_blocks(self.context, process.capabilities)
        # Files restored since the agent's last turn: said before the user's text (docs/workspace.md).
        blocks = [*(await self.checkpoints.prompt_note()), *blocks]
        prompt = process.conn.prompt(session_id=self.agent_session_id, prompt=blocks)
        task = asyncio.ensure_future(process.call(prompt))
        task.add_done_callback(self._turn_over)
        self.prompt_sent.set()
        aborted = asyncio.ensure_future(self.aborted.wait())
        try:
            done, _ = await asyncio.wait({task, aborted}, return_when=asyncio.FIRST_COMPLETED)
            if task not in done:
                task.cancel()
                await self._abort_agent()
                if self.abort_reason == CANCEL_TIMEOUT:
                    await self._finish_cancelled("the agent did not acknowledge the cancel in time")
                    return
                if self.abort_reason == JOURNAL_LOST:
                    await self._fail("journal_write_lost", JOURNAL_LOST_MESSAGE)
                    return
                raise RunAborted(self.abort_reason)
            response = task.result()
        except AgentDied as exc:
            if self.cancel_requested.is_set():
                await self._finish_cancelled("the agent exited while cancelling")
            else:
                await self._fail("agent_died", f"The agent process died during the turn: {exc}")
            return
        except acp.RequestError as exc:
            # Hermes jams a session after a cancel during a tool call (-32603): retire
            # the process so the session's next turn reloads it in a fresh one.
            process.poisoned = f"prompt failed: {exc}"
            if self.cancel_requested.is_set():
                await self._finish_cancelled("the agent failed the turn while cancelling")
            else:
                await self._fail("agent_error", f"The agent failed the turn: {exc}")
            return
        except TimeoutError:
            process.poisoned = "cancel not acknowledged"
            await self._finish_cancelled("the agent did not acknowledge the cancel in time")
            return
        finally:
            aborted.cancel()
        await self._complete(response)

    async def _complete(self, response: Any) -> None:
        if self.abort_reason == JOURNAL_LOST:  # the turn ended while the failure was reported
            await self._fail("journal_write_lost", JOURNAL_LOST_MESSAGE)
            return
        data = response.model_dump(by_alias=True, exclude_none=True, mode="json")
        stop_reason = data.get("stopReason", "end_turn")
        cumulative = self.context.cumulative_usage
        previous = await retried(previous_usage_total, self.context) if cumulative else None
        usage = per_turn_usage(data.get("usage"), previous, cumulative)
        usage_record = {**usage, "context": self.translator.usage}
        if cumulative and data.get("usage"):
            usage_record["session_total"] = data["usage"]
        state = (
            RunStatus.CANCELLED
            if stop_reason == "cancelled" or self.cancel_requested.is_set()
            else RunStatus.COMPLETED
        )
        usage_final: UsageFinal = {**usage, "context": self.translator.usage}
        final = [
            *self.translator.finish("cancelled" if state == RunStatus.CANCELLED else "turn_end"),
            *self.requests.cancel_all("turn ended"),
            NewEvent(EventType.USAGE_FINAL, usage_final),
            done_event(state, stop_reason=stop_reason, usage=usage),
        ]
        await self._finish_safely(final, stop_reason=stop_reason, usage=usage_record)

    # ------------------------------------------------------------- endings

    async def _finish_safely(self, final: list[NewEvent], **updates: Any) -> None:
        try:
            await self.checkpoints.end()  # a finished run always has both ends
            await self.writer.finish(final, **updates)
        except AlreadyTerminal:
            log.info("run %s already had its terminal event", self.run_id)
        await self._after_finish()

    async def _after_finish(self) -> None:
        commands = self._new_commands()
        if self.translator.title or commands is not None:
            await retried(store_session_meta, self.context.session_id, self.translator.title, commands)
        self.host.wake()

    def _new_commands(self) -> list[dict[str, Any]] | None:
        """The agent's commands if its Session row does not hold them yet, else None.

        Agents repeat their commands at every turn's start (the process replays the latest
        too): writing them each time was a write and a session.changed, and every viewer's
        snapshot read, beside each turn's first tokens.
        """
        commands = self.translator.commands
        if commands is None or self.process is None:
            return commands
        if self.process.stored_commands.get(self.agent_session_id) == commands:
            return None
        self.process.stored_commands[self.agent_session_id] = commands
        return commands

    async def _fail(self, code: str, message: str) -> None:
        final = [
            *self.translator.finish("failed"),
            *self.requests.cancel_all("run failed"),
            NewEvent(EventType.ERROR, Error(code=code, message=message, terminal=True)),
            done_event(RunStatus.FAILED, reason=message, code=code),
        ]
        await self._finish_safely(final, error=message)

    async def _finish_cancelled(self, reason: str) -> None:
        final = [
            *self.translator.finish("cancelled"),
            *self.requests.cancel_all("cancelled"),
            done_event(RunStatus.CANCELLED, stop_reason="cancelled", reason=reason),
        ]
        await self._finish_safely(final, stop_reason="cancelled")

    async def _abort_agent(self) -> None:
        """Stop the agent's turn without writing: the run is no longer ours to journal."""
        self.requests.refuse_all()
        if self.process is not None and self.process.alive and self.agent_session_id:
            try:
                await self.process.call(self.process.conn.cancel(session_id=self.agent_session_id), 5)
            except Exception:
                self.process.poisoned = "aborted mid-turn"

    def abort(self, reason: str) -> None:
        self.abort_reason = reason
        self.aborted.set()

    # ------------------------------------------------------ agent callbacks

    def on_update(self, update: Any) -> None:
        data = as_dict(update)  # once: every step below reads the dict
        if self.steers_in_flight and _is_steer_ack(data):
            return
        events = self.translator.translate(data)
        if events:
            self.writer.add(events)
        if data.get("sessionUpdate") == "current_mode_update" and data.get("currentModeId"):
            # The agent switched mode itself: the session's mode follows (session_config.py), in
            # the journal's order, so before this turn ends and the next one's claim reads it.
            mode, session_id = str(data["currentModeId"]), self.context.session_id
            shown = NewEvent(EventType.PROGRESS, Progress(text=f"The agent switched to mode {mode}."))
            self._spawn(self.writer.flush([shown], also=lambda: store_current_mode(session_id, mode)))
        if data.get("sessionUpdate") == "config_option_update":  # the pickers follow (session_config.py)
            stored = session_config.store_reported_options
            self._spawn(stored(self.process, self.agent_session_id, self.context.session_id))
        if data.get("sessionUpdate") == "available_commands_update":
            commands = self._new_commands()
            if commands is not None:
                self._spawn(retried(store_session_meta, self.context.session_id, None, commands))

    async def on_permission(self, tool_call: Any, options: list[Any]) -> schema.RequestPermissionResponse:
        return await self.requests.permission(tool_call, options)

    async def on_elicitation(self, message: str, mode: Any) -> Any:
        return await self.requests.elicitation(message, mode)

    # ------------------------------------------------------------ controls

    def start_control(self, control: Control) -> None:
        """Apply `control` in a task of this execution's: the runner's control loop does not wait."""
        if control.pk not in self.applying:
            self._spawn(self.apply_control(control))

    async def apply_control(self, control: Control) -> None:
        if control.pk in self.applying:
            return
        self.applying.add(control.pk)
        try:
            handler: Callable[[Control], Any] = {
                ControlKind.CANCEL: self._apply_cancel,
                ControlKind.APPROVAL: self.requests.answer_approval,
                ControlKind.CLARIFY: self.requests.answer_clarify,
                ControlKind.STEER: self._apply_steer,
            }.get(control.kind, self._apply_unsupported)
            await handler(control)
        except AlreadyTerminal:
            await sync_to_async(record_result)(control.pk, "expired", "The run already ended.")

    async def _apply_unsupported(self, control: Control) -> None:
        await sync_to_async(record_result)(
            control.pk, "unsupported", f"{control.kind} is not supported by this runner."
        )

    async def _apply_cancel(self, control: Control) -> None:
        if self.cancel_requested.is_set():
            await sync_to_async(record_result)(control.pk, "duplicate", "Cancel already in progress.")
            return
        self.cancel_requested.set()
        if self.process is not None and self.agent_session_id:
            self.process.terminals.kill_session(self.agent_session_id)  # Stop kills the turn's commands
        resolved = self.requests.cancel_all("cancelled")
        await self.writer.flush(
            [*resolved, NewEvent(EventType.STATUS, Status(status=RunStatus.CANCELLING))],
            also=lambda: record_result(control.pk, "accepted", "Cancel sent to the agent."),
        )
        if self.process is not None and self.agent_session_id and self.process.alive:
            with contextlib.suppress(AgentDied, TimeoutError, acp.RequestError):
                await self.process.call(self.process.conn.cancel(session_id=self.agent_session_id), 5)
            self._spawn(self._cancel_deadline())

    async def _cancel_deadline(self) -> None:
        # Then we stop waiting, retire the agent's process and record the cancel ourselves.
        await asyncio.sleep(settings.HERMESWEB_CANCEL_GRACE_SECONDS)
        if self.process is not None:
            self.process.poisoned = "cancel not acknowledged"
        self.abort(CANCEL_TIMEOUT)

    async def _apply_steer(self, control: Control) -> None:
        text = control.payload.get("text", "")
        intent_id = int(control.target_id)
        if not self.prompt_sent.is_set():
            # The run is `running` while the agent starts and the session opens: hold the
            # steer until the turn exists rather than refuse it. If the turn never starts
            # (failure, cancel) the control stays pending and the run's end settles it.
            waiter = asyncio.ensure_future(self.prompt_sent.wait())
            ended = asyncio.ensure_future(self.aborted.wait())
            await asyncio.wait({waiter, ended}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            ended.cancel()
            if not self.prompt_sent.is_set():
                return
        steer = (self.process.capabilities.get("steer") if self.process else None) or False
        if not steer or self.process is None or not self.agent_session_id:
            await sync_to_async(intents.do_steer_failed)(
                control.pk, intent_id, "The agent cannot take steer guidance right now."
            )
            return
        if self.cancel_requested.is_set():
            await sync_to_async(intents.do_steer_failed)(control.pk, intent_id, "The run is being cancelled.")
            return
        if self.turn_over:
            # A `/steer` now would reach an idle session, which runs it as an untracked
            # prompt. Leave the control pending: the terminal event's transaction turns
            # the intent into a leftover (intents.services.settle_after_run).
            return
        self.steers_in_flight += 1
        try:
            if steer == "extension":
                outcome = await self._steer_by_extension(text)
            else:
                prompt = self.process.conn.prompt(
                    session_id=self.agent_session_id, prompt=[acp.text_block(f"/steer {text}")]
                )
                await self.process.call(prompt, 30)
                outcome = "delivered"
        except (AgentDied, TimeoutError, acp.RequestError) as exc:
            outcome = f"The agent refused the steer: {exc}"
        finally:
            self.steers_in_flight -= 1
        if outcome != "delivered":
            await sync_to_async(intents.do_steer_failed)(control.pk, intent_id, outcome)
            return
        await self.writer.flush(
            [
                NewEvent(
                    EventType.STEER_DELIVERED,
                    SteerDelivered(intent_id=intent_id, text=text, state="delivered"),
                )
            ],
            also=lambda: intents.do_steer_delivered(control.pk, intent_id),
        )

    async def _steer_by_extension(self, text: str) -> str:
        """`_session/steering` (codex-acp, claude-agent-acp): "delivered", or why it was not."""
        assert self.process is not None
        request = self.process.conn.ext_method(
            "session/steering",
            {
                "sessionId": self.agent_session_id,
                "prompt": [{"type": "text", "text": text}],
                # Past the turn's end the agent answers "promptRequired" rather than start a turn
                # of its own that no run tracks (claude-agent-acp, codex-acp honour it).
                "_meta": {"steering": {"idleBehavior": "promptRequired"}},
            },
        )
        answer = await self.process.call(request, 30) or {}
        outcome = answer.get("outcome")
        if outcome == "injected":
            return "delivered"
        # "startedNewTurn" would be a turn this workbench does not track: refuse it as a steer.
        reason = answer.get("reason") or outcome or "no answer"
        return f"The agent did not inject the steer ({reason})."

    def _turn_over(self, _: asyncio.Future[Any]) -> None:
        self.turn_over = True

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _is_steer_ack(update: Any) -> bool:
    data = as_dict(update)
    if data.get("sessionUpdate") != "agent_message_chunk":
        return False
    text = (data.get("content") or {}).get("text", "")
    # Hermes prefixes its acknowledgement with an emoji: look near the start, not at it.
    return any(ack in text[:40] for ack in STEER_ACKS)
