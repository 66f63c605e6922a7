"""Agent jobs executed by a runner: session discovery and import over ACP.

Design note: docs/runner.md ("Agent jobs"); docs/operations.md ("Session discovery").
The rows (request, claim, finish, the imported session) are runs/discovery.py's; this
module talks ACP through the runner's agent pool — the same process the project's turns
use.

- `list_sessions`: `session/list` filtered by the project's cwd, every page.
- `import_session`: `session/load` with a sink that keeps the replayed history
  (a normal reload drops it), the history split at each user message into
  completed `import` runs journaled once, and the agent session marked loaded
  in that process so the session's next turn prompts without reloading.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Protocol

import acp
from acp import schema
from asgiref.sync import sync_to_async
from django.conf import settings

from runs.discovery import (
    ImportedHistory,
    ImportedTurn,
    JobContext,
    claim_job,
    finish_job,
    import_result,
    imported_session,
    job_context,
    reap_orphaned_jobs,
    write_import,
)
from runs.journal import NewEvent
from runs.models import AgentJobKind
from runs.runner.agents import AgentDied, AgentProcess, Agents, ProjectPathRefused
from runs.runner.coalesce import merged
from runs.runner.connections import revived
from runs.runner.redact_stream import guarded
from runs.runner.translate import Translator, as_dict, text_of

log = logging.getLogger(__name__)

LIST_TIMEOUT = 60.0
LOAD_TIMEOUT = 300.0
# A misbehaving agent could hand out cursors forever: stop after this many pages.
MAX_LIST_PAGES = 50
MAX_CONCURRENT_JOBS = 4
# Imported deltas of one segment are merged by the live writer's rule, into rows of up to this
# much text: a replay arrives all at once, and nobody watches it stream.
MERGE_LIMIT = 64 * 1024
# Session-level updates: they describe the session, not a turn of its history.
SESSION_UPDATES = ("available_commands_update", "session_info_update", "current_mode_update")


class JobFailed(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# ---------------------------------------------------------------- history → turns


@dataclass
class ReplayedTurn:
    prompt: str
    message_id: str | None = None
    updates: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class SplitHistory:
    turns: list[ReplayedTurn]
    title: str | None
    commands: list[dict[str, Any]] | None


def split_history(updates: list[Any]) -> SplitHistory:
    """Cut a replayed history into turns: each user message starts one.

    Chunks of one user message (same `messageId`, or consecutive chunks without
    one) make one prompt. Session-level updates (title, commands) describe the
    session rather than a turn; anything the agent sent before the first user
    message becomes a turn with an empty prompt.
    """
    meta = Translator()
    turns: list[ReplayedTurn] = []
    current: ReplayedTurn | None = None
    for update in updates:
        data = as_dict(update)
        kind = data.get("sessionUpdate")
        if kind in SESSION_UPDATES:
            meta.translate(data)
            continue
        if kind == "user_message_chunk":
            text = text_of(data.get("content"))
            message_id = data.get("messageId")
            same_message = (
                current is not None
                and not current.updates
                and (message_id is None or message_id == current.message_id)
            )
            if same_message and current is not None:
                current.prompt += text
            else:
                current = ReplayedTurn(prompt=text, message_id=message_id)
                turns.append(current)
            continue
        if current is None:
            current = ReplayedTurn(prompt="")
            turns.append(current)
        current.updates.append(data)
    return SplitHistory(turns=turns, title=meta.title, commands=meta.commands)


def turn_body(turn: ReplayedTurn) -> list[NewEvent]:
    """What the agent produced in one replayed turn, as journal events (deltas merged)."""
    translator = Translator()
    body: list[NewEvent] = []
    for update in turn.updates:
        body += translator.translate(update)
    body += translator.finish()
    return merged(guarded(body), MERGE_LIMIT)  # rows cut only where no secret runs across


def imported_history(split: SplitHistory) -> ImportedHistory:
    turns = [ImportedTurn(prompt=turn.prompt, events=turn_body(turn)) for turn in split.turns]
    return ImportedHistory(turns=turns, title=split.title, commands=split.commands)


# ---------------------------------------------------------------- runner side: ACP


class HistoryCollector:
    """A session sink that keeps what `session/load` replays, and grants nothing."""

    def __init__(self) -> None:
        self.updates: list[Any] = []

    def on_update(self, update: Any) -> None:
        self.updates.append(update)

    async def on_permission(self, tool_call: Any, options: list[Any]) -> schema.RequestPermissionResponse:
        return schema.RequestPermissionResponse(outcome=schema.DeniedOutcome(outcome="cancelled"))

    async def on_elicitation(self, message: str, mode: Any) -> Any:
        return schema.CancelElicitationResponse(action="cancel")


async def _replay_settled(process: AgentProcess, agent_session_id: str) -> None:
    """Wait until the notifications read before the load's answer have been handled.

    The SDK dispatches each notification as a task, so the answer can resolve
    first; its own prompt() waits on the same tracker for the same reason.
    """
    tracker = getattr(process.conn, "_session_updates", None)
    wait = getattr(tracker, "wait", None)
    if wait is not None:
        await wait(agent_session_id)
    else:
        await asyncio.sleep(0)


def _same_dir(a: str, b: str) -> bool:
    return os.path.normpath(a) == os.path.normpath(b) or os.path.realpath(a) == os.path.realpath(b)


class JobHost(Protocol):
    """What the job loop uses of the runner it runs in (RunnerProcess, runs/runner/process.py)."""

    @property
    def runner_id(self) -> str: ...

    @property
    def pool(self) -> Agents: ...

    @property
    def poll(self) -> float: ...  # seconds between claims when there is no job

    @property
    def stopping(self) -> asyncio.Event: ...


class JobLoop:
    """Claims and executes agent jobs on the runner's event loop."""

    def __init__(self, host: JobHost) -> None:
        self.host = host
        self.tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        reap_every = max(settings.HERMESWEB_LEASE_SECONDS / 3, 0.5)
        next_reap = 0.0
        loop = asyncio.get_running_loop()
        try:
            while not self.host.stopping.is_set():
                claimed = False
                try:
                    if loop.time() >= next_reap:
                        next_reap = loop.time() + reap_every
                        reaped = await sync_to_async(revived(reap_orphaned_jobs))(self.host.runner_id)
                        if reaped:
                            log.warning("failed agent jobs left by vanished runners: %s", reaped)
                    if len(self.tasks) < MAX_CONCURRENT_JOBS:
                        job_id = await sync_to_async(revived(claim_job))(self.host.runner_id)
                        if job_id is not None:
                            self._start(job_id)
                            claimed = True
                except Exception:
                    log.exception("job loop iteration failed")
                if not claimed:
                    await asyncio.sleep(self.host.poll)
            # Stopping: claim nothing more; jobs in flight finish until the runner cancels this loop.
            if self.tasks:
                await asyncio.wait(list(self.tasks))
        finally:
            for task in list(self.tasks):
                task.cancel()

    def _start(self, job_id: int) -> None:
        task = asyncio.ensure_future(self.execute(job_id))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def execute(self, job_id: int) -> None:
        try:
            ctx = await sync_to_async(job_context)(job_id)
            if ctx.kind == AgentJobKind.LIST_SESSIONS:
                result = await self._list_sessions(ctx)
            elif ctx.kind == AgentJobKind.IMPORT_SESSION:
                result = await self._import_session(ctx)
            else:
                raise JobFailed("unknown_kind", f"unknown job kind {ctx.kind!r}")
        except asyncio.CancelledError:
            # Best effort: if this write is cut short too, another runner fails the job as runner_lost.
            with contextlib.suppress(BaseException):
                await asyncio.shield(
                    sync_to_async(finish_job)(
                        job_id, error_code="runner_shutdown", error="The runner stopped; ask again."
                    )
                )
            raise
        except JobFailed as exc:
            await sync_to_async(finish_job)(job_id, error_code=exc.code, error=exc.message)
        except AgentDied as exc:
            await sync_to_async(finish_job)(job_id, error_code="agent_died", error=str(exc))
        except TimeoutError:
            await sync_to_async(finish_job)(
                job_id, error_code="agent_timeout", error="The agent did not answer in time."
            )
        except Exception:
            log.exception("agent job %s crashed in the runner", job_id)
            await sync_to_async(finish_job)(
                job_id, error_code="runner_error", error="The runner hit an internal error."
            )
        else:
            await sync_to_async(finish_job)(job_id, result=result)

    async def _acquire(self, ctx: JobContext) -> AgentProcess:
        spec = settings.HERMESWEB_AGENTS.get(ctx.agent)
        if spec is None:
            raise JobFailed("agent_unknown", f"Agent {ctx.agent!r} is not configured on this runner.")
        try:
            return await self.host.pool.acquire(spec, ctx.project_id, ctx.cwd)
        except ProjectPathRefused as exc:
            raise JobFailed(exc.code, exc.message) from None
        except AgentDied as exc:
            raise JobFailed("agent_start_failed", str(exc)) from None

    async def _list_sessions(self, ctx: JobContext) -> dict[str, Any]:
        process = await self._acquire(ctx)
        try:
            if "list" not in (process.capabilities.get("session_capabilities") or {}):
                raise JobFailed("list_unsupported", f"Agent {ctx.agent!r} does not list its sessions.")
            sessions: dict[str, dict[str, Any]] = {}
            cursor: str | None = None
            for _ in range(MAX_LIST_PAGES):
                try:
                    page = await process.call(
                        process.conn.list_sessions(cwd=ctx.cwd, cursor=cursor), LIST_TIMEOUT
                    )
                except acp.RequestError as exc:
                    raise JobFailed("list_failed", f"The agent refused session/list: {exc}") from None
                for info in page.sessions:
                    # The agent filters by cwd; an agent that ignores the filter must not leak others.
                    if _same_dir(info.cwd, ctx.cwd) and info.session_id not in sessions:
                        sessions[info.session_id] = {
                            "agent_session_id": info.session_id,
                            "cwd": info.cwd,
                            "title": info.title,
                            "updated_at": info.updated_at,
                        }
                cursor = page.next_cursor
                if not cursor:
                    break
            return {"sessions": list(sessions.values()), "truncated": bool(cursor)}
        finally:
            await self.host.pool.release(process)

    async def _import_session(self, ctx: JobContext) -> dict[str, Any]:
        sid = str(ctx.payload.get("agent_session_id") or "")
        if not sid:
            raise JobFailed("invalid_payload", "An import needs an agent_session_id.")
        existing = await sync_to_async(imported_session)(ctx.project_id, sid)
        if existing is not None:
            # Already imported: no agent needed, the same session answers.
            return await sync_to_async(import_result)(existing, created=False)
        process = await self._acquire(ctx)
        try:
            if not process.capabilities.get("load_session"):
                raise JobFailed("load_unsupported", f"Agent {ctx.agent!r} cannot load sessions.")
            if sid in process.sinks or sid in process.loading:
                raise JobFailed("session_busy", "That agent session is in use in this project right now.")
            collector = HistoryCollector()
            # A sink, not `loading`: a reload drops the replay, an import needs every update of it.
            process.sinks[sid] = collector
            try:
                await process.call(
                    process.conn.load_session(cwd=ctx.cwd, session_id=sid, mcp_servers=[]), LOAD_TIMEOUT
                )
                await _replay_settled(process, sid)
            except acp.RequestError as exc:
                raise JobFailed("load_failed", f"The agent could not load session {sid}: {exc}") from None
            finally:
                if process.sinks.get(sid) is collector:
                    del process.sinks[sid]
            history = split_history(collector.updates)
            if not history.turns:
                # Hermes answers a load of an unknown id with `{}` and replays nothing.
                raise JobFailed(
                    "empty_history",
                    f"The agent replayed no history for session {sid}: unknown to it, or never prompted.",
                )
            # This process has the session open now: the next turn prompts without reloading it.
            process.loaded.add(sid)
            write = sync_to_async(write_import)
            session, created = await write(ctx.project_id, sid, imported_history(history), ctx.agent)
            return await sync_to_async(import_result)(session, created=created)
        finally:
            await self.host.pool.release(process)
