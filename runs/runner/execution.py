"""One run executing on an agent: prompt, stream, controls, terminal event.

Design note: docs/runner.md. The execution is the only writer of its run's
journal while it holds the lease. Permission requests and elicitations are
futures held here while the ACP request is open; the browser answers them
through durable Control rows that the runner hands to `apply_control`.
Nothing is ever granted on the user's behalf.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import acp
from acp import schema
from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone

from intents import services as intents
from projects.models import Session
from runs import notify
from runs.journal import AlreadyTerminal, NewEvent, done_event
from runs.models import Control, ControlKind, EventType, Run, RunStatus
from runs.runner import leases
from runs.runner.agents import AgentDied, AgentProcess
from runs.runner.connections import retried
from runs.runner.translate import Translator, as_dict, per_turn_usage
from runs.runner.writer import JournalWriter

if TYPE_CHECKING:
    import psycopg

    from runs.runner.process import RunnerProcess

log = logging.getLogger(__name__)

# After session/cancel, how long the agent gets to end the turn before we
# stop waiting, retire its process and record the cancel ourselves.
CANCEL_GRACE_SECONDS = 10.0
# Acknowledgements agents print for a `/steer` prompt; they belong to the steer, not the turn.
STEER_ACKS = ("Steer queued",)
CANCEL_TIMEOUT = "cancel not acknowledged"
# A flush of this run's events could not be written, nor shown to have landed, before
# HERMESWEB_DB_RETRY_SECONDS ran out (runs/runner/writer.py, `_write`): the turn has a hole.
JOURNAL_LOST = "journal write lost"
JOURNAL_LOST_MESSAGE = (
    "The database could not be reached for too long while part of this turn was being saved, "
    "so that part may be missing. The turn was stopped; send the message again to redo it."
)


class RunAborted(Exception):
    """The lease was lost (another runner reaped the run) or the runner is stopping."""


@dataclass
class Claimed:
    """A run this runner took, with what executing it needs."""

    ctx: dict[str, Any]
    more: bool = False  # another queued run was seen: claim again at once


def claim_and_start(runner_id: str) -> Claimed | None:
    """Claim the oldest queued run and read its context: on PostgreSQL one statement, alone.

    Its run.started is the execution's first event, written by the run's writer while the
    agent is prompted: in the claim's transaction it cost every first token a round trip
    and most of a commit more, ~1.2 ms here (bench/README.md, round six). The claim is
    durable before the agent is prompted; a runner that dies before run.started is written
    leaves a claimed run that the reaper marks interrupted, as it would any other.
    """
    claimed, more = leases.claim_in_transaction(runner_id)
    if claimed is None:
        return None
    return Claimed(_load_context(claimed), more)


async def aclaim_and_start(
    runner_id: str, conn: psycopg.AsyncConnection[Any], now: datetime | None = None
) -> Claimed | None:
    """claim_and_start on PostgreSQL on the runner's own connection, without leaving its loop."""
    claimed, more = await leases.aclaim_postgres(conn, runner_id, now)
    if claimed is None:
        return None
    previous = await sync_to_async(_previous_usage_total)(claimed) if _cumulative_usage(claimed) else None
    return Claimed(_context(claimed, previous), more)


def unstarted_claims(
    runner_id: str, claimed_at: Collection[datetime], running: Collection[int]
) -> list[Claimed]:
    """The runs claims took whose answers never arrived, ready to start (leases.unstarted_claims)."""
    found = leases.unstarted_claims(runner_id, claimed_at, running)
    return [Claimed(_load_context(claimed)) for claimed in found]


def _started_event(ctx: dict[str, Any], runner_id: str) -> NewEvent:
    return NewEvent(
        EventType.RUN_STARTED,
        {
            "status": RunStatus.RUNNING,
            "session_id": ctx["session_id"],
            "agent": ctx["agent"],
            "project": ctx["project_name"],
            "workspace": ctx["cwd"],
            "model": ctx["model"] or None,
            "mode": ctx["mode"] or None,
            "runner": runner_id,
            "source": ctx["source"],
        },
    )


class RunExecution:
    def __init__(self, runner: RunnerProcess, claimed: Claimed) -> None:
        self.runner = runner
        self.run_id: int = claimed.ctx["run_id"]
        self.writer = JournalWriter(self.run_id, last_seq=claimed.ctx["last_seq"])
        self.writer.on_lost = lambda _: self.abort(JOURNAL_LOST)
        self.translator = Translator()
        self.process: AgentProcess | None = None
        self.agent_session_id = ""
        self.ctx = claimed.ctx
        self.approvals: dict[str, tuple[asyncio.Future[Any], dict[str, Any]]] = {}
        self.clarifications: dict[str, asyncio.Future[Any]] = {}
        self.cancel_requested = asyncio.Event()
        self.aborted = asyncio.Event()
        self.abort_reason = ""
        self.steers_in_flight = 0
        self.turn_over = False
        self.prompt_sent = asyncio.Event()
        self.applying: set[int] = set()
        self._bg: set[asyncio.Task[Any]] = set()

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
                        {"code": "runner_error", "message": "The runner hit an internal error."},
                    ),
                    done_event(RunStatus.FAILED, reason="runner error"),
                ],
                error="runner internal error",
            )
        finally:
            for task in list(self._bg):
                task.cancel()
            if self.process is not None:
                # Only our own: the session's next turn (a drained queue item) may already
                # have been claimed and have registered itself for the same agent session.
                if self.process.sinks.get(self.agent_session_id) is self:
                    del self.process.sinks[self.agent_session_id]
                await self.runner.pool.release(self.process)

    async def _execute(self) -> None:
        # Written while the agent is prompted; first of the run's events, as the writer keeps order.
        self.writer.add([_started_event(self.ctx, self.runner.runner_id)])
        spec = settings.HERMESWEB_AGENTS.get(self.ctx["agent"])
        if spec is None:
            await self._fail(
                "agent_unknown", f"Agent {self.ctx['agent']!r} is not configured on this runner."
            )
            return
        try:
            self.process = await self.runner.pool.acquire(spec, self.ctx["project_id"], self.ctx["cwd"])
            await self._open_session()
        except AgentDied as exc:
            await self._fail("agent_start_failed", str(exc))
            return
        except acp.RequestError as exc:
            await self._fail("agent_session_failed", f"The agent refused to open the session: {exc}")
            return
        if self.cancel_requested.is_set():
            await self._finish_cancelled("cancelled before the prompt was sent")
            return
        await self._prompt()

    async def _open_session(self) -> None:
        assert self.process is not None
        process, sid = self.process, self.ctx["agent_session_id"]
        if sid and sid in process.loaded:
            self.agent_session_id = sid
        elif sid and process.capabilities.get("load_session"):
            # A runner or agent restart: reopen. The replayed history is dropped (the journal has it).
            process.loading.add(sid)
            try:
                await process.call(
                    process.conn.load_session(cwd=self.ctx["cwd"], session_id=sid, mcp_servers=[]), 120
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
                            {"text": "The agent cannot reload sessions; starting a new one."},
                        )
                    ]
                )
            response = await process.call(process.conn.new_session(cwd=self.ctx["cwd"], mcp_servers=[]), 120)
            self.agent_session_id = response.session_id
            process.loaded.add(self.agent_session_id)
            await retried(_store_agent_session, self.ctx["session_id"], self.agent_session_id)
        process.sinks[self.agent_session_id] = self
        if self.agent_session_id in process.commands:
            self.on_update(process.commands[self.agent_session_id])

    async def _prompt(self) -> None:
        assert self.process is not None
        process = self.process
        prompt = process.conn.prompt(
            session_id=self.agent_session_id, prompt=[acp.text_block(self.ctx["prompt_text"])]
        )
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
        usage = per_turn_usage(
            data.get("usage"), self.ctx.get("previous_usage_total"), self.ctx["cumulative_usage"]
        )
        usage_record = {**usage, "context": self.translator.usage}
        if self.ctx["cumulative_usage"] and data.get("usage"):
            usage_record["session_total"] = data["usage"]
        state = (
            RunStatus.CANCELLED
            if stop_reason == "cancelled" or self.cancel_requested.is_set()
            else RunStatus.COMPLETED
        )
        final = [
            *self.translator.finish(),
            *self._resolve_open_requests("turn ended"),
            NewEvent(EventType.USAGE_FINAL, {**usage, "context": self.translator.usage}),
            done_event(state, stop_reason=stop_reason, usage=usage),
        ]
        await self._finish_safely(final, stop_reason=stop_reason, usage=usage_record)

    # ------------------------------------------------------------- endings

    async def _finish_safely(self, final: list[NewEvent], **updates: Any) -> None:
        try:
            await self.writer.finish(final, **updates)
        except AlreadyTerminal:
            log.info("run %s already had its terminal event", self.run_id)
        await self._after_finish()

    async def _after_finish(self) -> None:
        commands = self._new_commands()
        if self.translator.title or commands is not None:
            await retried(_store_session_meta, self.ctx["session_id"], self.translator.title, commands)
        self.runner.wake()

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
            *self.translator.finish(),
            *self._resolve_open_requests("run failed"),
            NewEvent(EventType.ERROR, {"code": code, "message": message, "terminal": True}),
            done_event(RunStatus.FAILED, reason=message, code=code),
        ]
        await self._finish_safely(final, error=message)

    async def _finish_cancelled(self, reason: str) -> None:
        final = [
            *self.translator.finish(),
            *self._resolve_open_requests("cancelled"),
            done_event(RunStatus.CANCELLED, stop_reason="cancelled", reason=reason),
        ]
        await self._finish_safely(final, stop_reason="cancelled")

    async def _abort_agent(self) -> None:
        """Stop the agent's turn without writing: the run is no longer ours to journal."""
        for future, _ in self.approvals.values():
            if not future.done():
                future.set_result(_denied())
        for future in self.clarifications.values():
            if not future.done():
                future.set_result(schema.CancelElicitationResponse(action="cancel"))
        if self.process is not None and self.process.alive and self.agent_session_id:
            try:
                await self.process.call(self.process.conn.cancel(session_id=self.agent_session_id), 5)
            except Exception:
                self.process.poisoned = "aborted mid-turn"

    def abort(self, reason: str) -> None:
        self.abort_reason = reason
        self.aborted.set()

    def _resolve_open_requests(self, why: str) -> list[NewEvent]:
        """Answer what the agent still waits on as cancelled; journal each resolution."""
        events = []
        for approval_id, (future, _) in list(self.approvals.items()):
            if not future.done():
                future.set_result(_denied())
                events.append(
                    NewEvent(
                        EventType.APPROVAL_RESOLVED,
                        {"approval_id": approval_id, "outcome": "cancelled", "reason": why},
                    )
                )
        for clarify_id, future in list(self.clarifications.items()):
            if not future.done():
                future.set_result(schema.CancelElicitationResponse(action="cancel"))
                events.append(
                    NewEvent(
                        EventType.CLARIFY_RESOLVED,
                        {"clarify_id": clarify_id, "outcome": "cancelled", "reason": why},
                    )
                )
        self.approvals.clear()
        self.clarifications.clear()
        return events

    # ------------------------------------------------------ agent callbacks

    def on_update(self, update: Any) -> None:
        data = as_dict(update)  # once: every step below reads the dict
        if self.steers_in_flight and _is_steer_ack(data):
            return
        events = self.translator.translate(data)
        if events:
            self.writer.add(events)
        if data.get("sessionUpdate") == "available_commands_update":
            commands = self._new_commands()
            if commands is not None:
                self._spawn(retried(_store_session_meta, self.ctx["session_id"], None, commands))

    async def on_permission(self, tool_call: Any, options: list[Any]) -> schema.RequestPermissionResponse:
        if self.cancel_requested.is_set():
            return _denied()
        approval_id = f"ap-{uuid.uuid4().hex[:12]}"
        call = as_dict(tool_call)
        payload = {
            "approval_id": approval_id,
            "tool_call_id": call.get("toolCallId"),
            "title": call.get("title") or "Permission requested",
            "tool_kind": call.get("kind"),
            "arguments": call.get("rawInput"),
            "content": self.translator._tool_payload(call).get("content", []),
            "options": [{"option_id": o.option_id, "name": o.name, "kind": o.kind} for o in options],
        }
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.approvals[approval_id] = (future, payload)
        await self.writer.flush(
            [
                NewEvent(EventType.APPROVAL_REQUESTED, payload),
                NewEvent(EventType.STATUS, {"status": RunStatus.AWAITING_APPROVAL}),
            ],
            status=RunStatus.AWAITING_APPROVAL,
        )
        self.runner.poke_controls()
        return await future

    async def on_elicitation(self, message: str, mode: Any) -> Any:
        if self.cancel_requested.is_set():
            return schema.CancelElicitationResponse(action="cancel")
        clarify_id = f"cl-{uuid.uuid4().hex[:12]}"
        requested = getattr(mode, "requested_schema", None)
        schema_dict = requested.model_dump(by_alias=True, exclude_none=True, mode="json") if requested else {}
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.clarifications[clarify_id] = future
        await self.writer.flush(
            [
                NewEvent(
                    EventType.CLARIFY_REQUESTED,
                    {
                        "clarify_id": clarify_id,
                        "question": message,
                        "schema": schema_dict,
                        "input_mode": "form" if schema_dict else "text",
                    },
                ),
                NewEvent(EventType.STATUS, {"status": RunStatus.AWAITING_CLARIFY}),
            ],
            status=RunStatus.AWAITING_CLARIFY,
        )
        self.runner.poke_controls()
        return await future

    # ------------------------------------------------------------ controls

    async def apply_control(self, control: Control) -> None:
        if control.pk in self.applying:
            return
        self.applying.add(control.pk)
        try:
            handler: Callable[[Control], Any] = {
                ControlKind.CANCEL: self._apply_cancel,
                ControlKind.APPROVAL: self._apply_approval,
                ControlKind.CLARIFY: self._apply_clarify,
                ControlKind.STEER: self._apply_steer,
            }.get(control.kind, self._apply_unsupported)
            await handler(control)
        except AlreadyTerminal:
            await sync_to_async(_record)(control.pk, "expired", "The run already ended.")

    async def _apply_unsupported(self, control: Control) -> None:
        await sync_to_async(_record)(
            control.pk, "unsupported", f"{control.kind} is not supported by this runner."
        )

    async def _apply_cancel(self, control: Control) -> None:
        if self.cancel_requested.is_set():
            await sync_to_async(_record)(control.pk, "duplicate", "Cancel already in progress.")
            return
        self.cancel_requested.set()
        resolved = self._resolve_open_requests("cancelled")
        await self.writer.flush(
            [*resolved, NewEvent(EventType.STATUS, {"status": RunStatus.CANCELLING})],
            also=lambda: _record(control.pk, "accepted", "Cancel sent to the agent."),
        )
        if self.process is not None and self.agent_session_id and self.process.alive:
            with contextlib.suppress(AgentDied, TimeoutError, acp.RequestError):
                await self.process.call(self.process.conn.cancel(session_id=self.agent_session_id), 5)
            self._spawn(self._cancel_deadline())

    async def _cancel_deadline(self) -> None:
        await asyncio.sleep(CANCEL_GRACE_SECONDS)
        if self.process is not None:
            self.process.poisoned = "cancel not acknowledged"
        self.abort(CANCEL_TIMEOUT)

    async def _apply_approval(self, control: Control) -> None:
        entry = self.approvals.get(control.target_id)
        if entry is None or entry[0].done():
            await sync_to_async(_record)(control.pk, "expired", "The approval request is no longer open.")
            return
        future, _ = entry
        option_id = control.payload["option_id"]
        # Persist, then answer the agent.
        await self.writer.flush(
            [
                NewEvent(
                    EventType.APPROVAL_RESOLVED,
                    {"approval_id": control.target_id, "option_id": option_id, "outcome": "selected"},
                ),
                *self._status_after_answer(exclude_approval=control.target_id),
            ],
            also=lambda: _record(control.pk, "accepted", "Answer delivered."),
            **self._status_updates(exclude_approval=control.target_id),
        )
        del self.approvals[control.target_id]
        future.set_result(
            schema.RequestPermissionResponse(
                outcome=schema.AllowedOutcome(outcome="selected", option_id=option_id)
            )
        )

    async def _apply_clarify(self, control: Control) -> None:
        future = self.clarifications.get(control.target_id)
        if future is None or future.done():
            await sync_to_async(_record)(control.pk, "expired", "The question is no longer open.")
            return
        content = control.payload.get("content") or {}
        await self.writer.flush(
            [
                NewEvent(
                    EventType.CLARIFY_RESOLVED,
                    {"clarify_id": control.target_id, "answer": content, "outcome": "accepted"},
                ),
                *self._status_after_answer(exclude_clarify=control.target_id),
            ],
            also=lambda: _record(control.pk, "accepted", "Answer delivered."),
            **self._status_updates(exclude_clarify=control.target_id),
        )
        del self.clarifications[control.target_id]
        future.set_result(schema.AcceptElicitationResponse(action="accept", content=content))

    def _next_status(self, exclude_approval: str = "", exclude_clarify: str = "") -> str:
        if any(k != exclude_approval for k in self.approvals):
            return RunStatus.AWAITING_APPROVAL
        if any(k != exclude_clarify for k in self.clarifications):
            return RunStatus.AWAITING_CLARIFY
        return RunStatus.RUNNING

    def _status_after_answer(self, **exclude: str) -> list[NewEvent]:
        return [NewEvent(EventType.STATUS, {"status": self._next_status(**exclude)})]

    def _status_updates(self, **exclude: str) -> dict[str, Any]:
        return {"status": self._next_status(**exclude)}

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
                    EventType.STEER_DELIVERED, {"intent_id": intent_id, "text": text, "state": "delivered"}
                )
            ],
            also=lambda: intents.do_steer_delivered(control.pk, intent_id),
        )

    async def _steer_by_extension(self, text: str) -> str:
        """`_session/steering` (codex-acp, claude-agent-acp): "delivered", or why it was not."""
        assert self.process is not None
        request = self.process.conn.ext_method(
            "session/steering",
            {"sessionId": self.agent_session_id, "prompt": [{"type": "text", "text": text}]},
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

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)


def _denied() -> schema.RequestPermissionResponse:
    return schema.RequestPermissionResponse(outcome=schema.DeniedOutcome(outcome="cancelled"))


def _is_steer_ack(update: Any) -> bool:
    data = as_dict(update)
    if data.get("sessionUpdate") != "agent_message_chunk":
        return False
    text = (data.get("content") or {}).get("text", "")
    # Hermes prefixes its acknowledgement with an emoji: look near the start, not at it.
    return any(ack in text[:40] for ack in STEER_ACKS)


# ------------------------------------------------------------- sync helpers


def _load_context(claimed: leases.ClaimedRun) -> dict[str, Any]:
    previous = _previous_usage_total(claimed) if _cumulative_usage(claimed) else None
    return _context(claimed, previous)


def _cumulative_usage(claimed: leases.ClaimedRun) -> bool:
    # Only an agent that reports session totals needs the last turn's (a read).
    spec = settings.HERMESWEB_AGENTS.get(claimed.agent)
    return bool(spec and spec.cumulative_usage)


def _previous_usage_total(claimed: leases.ClaimedRun) -> Any:
    previous = (
        Run.objects.filter(session_id=claimed.session_id, finished_at__isnull=False)
        .exclude(pk=claimed.run_id)
        .order_by("-finished_at")
        .first()
    )
    return (previous.usage or {}).get("session_total") if previous else None


def _context(claimed: leases.ClaimedRun, previous_usage_total: Any) -> dict[str, Any]:
    return {
        "run_id": claimed.run_id,
        "session_id": claimed.session_id,
        "agent_session_id": claimed.agent_session_id,
        "project_id": claimed.project_id,
        "project_name": claimed.project_name,
        "cwd": claimed.cwd,
        "agent": claimed.agent,
        "model": claimed.model,
        "mode": claimed.mode,
        "prompt_text": claimed.prompt_text,
        "source": claimed.source,
        "last_seq": claimed.last_seq,
        "cumulative_usage": _cumulative_usage(claimed),
        "previous_usage_total": previous_usage_total,
    }


def _store_agent_session(session_id: int, agent_session_id: str) -> None:
    Session.objects.filter(pk=session_id).update(agent_session_id=agent_session_id, updated_at=timezone.now())
    notify.publish_session_changed(session_id)


def _store_session_meta(session_id: int, title: str | None, commands: list[dict[str, Any]] | None) -> None:
    fields: dict[str, Any] = {}
    if commands is not None:
        fields["commands"] = commands
    if title:
        # The agent's title names a session the user has not named.
        Session.objects.filter(pk=session_id, title="").update(title=title)
    if fields:
        Session.objects.filter(pk=session_id).update(**fields)
    notify.publish_session_changed(session_id)


def _record(control_id: int, result: str, message: str) -> None:
    Control.objects.filter(pk=control_id).record(result, message)
