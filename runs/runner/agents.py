"""Supervised, reused agent processes: at most one per (project, agent).

Design note: docs/runner.md ("Agent processes"). Hermes takes ~1.5 s to start,
so a process serves every turn of its project until it dies, is retired
(after a jammed session) or idles out. The ACP client side routes each
`session/update`, permission request and elicitation to the run executing on
that agent session; updates for sessions being loaded (history replay) are
dropped, because our journal already holds that history.

Before a process starts, the pool re-checks the project's directory
(`projects.paths.validate_project_location`) and finds its owner, whose state
directory the agent gets as HOME; the process runs in bubblewrap when that
applies (runs/runner/sandbox.py, docs/security.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import acp
from acp import schema
from asgiref.sync import sync_to_async
from django.conf import settings

from projects.models import Project
from projects.paths import PathRefused, validate_project_location
from projects.refusals import Refused
from runs import agent_catalog, agents
from runs.agents import AgentSpec, agent_state_dir, detected_steer
from runs.models import Run
from runs.runner import sandbox
from runs.runner.account import agent_account
from runs.runner.client_methods import FS_CAPABILITIES, ClientFilesAndTerminals, launch_like_agent
from runs.runner.connections import retried, revived
from runs.runner.netpolicy import NetworkPolicy, policy_for
from runs.runner.netproxy import NetworkProxy, Refusal, private_socket_dir
from runs.runner.redact_stream import RedactedLog
from runs.runner.session_config import (
    AgentSessionConfig,
    record_config_update,
    record_mode_update,
    record_opened,
)
from runs.runner.stdio import AgentDied, StdioTransport, spawn_agent
from runs.runner.terminals import Terminals
from runs.runner.translate import as_dict
from worktrees.trees import AgentTree, agent_tree

log = logging.getLogger(__name__)

INITIALIZE_TIMEOUT = 60.0
STDIO_LIMIT = 16 * 1024 * 1024


class ProjectPathRefused(Refused):
    """The project's directory no longer passes the path rules: no agent is started in it.

    The runner records it on the run; 409 only says what it would be as an answer (the state forbids).
    """

    code = "project_path_refused"

    def __init__(self, message: str) -> None:
        super().__init__(409, self.code, message)


@dataclass(frozen=True)
class Placement:
    """Where a project's agent runs: the checked directory and the owner's state directory."""

    project: Path
    state_dir: Path
    # A worktree session's: its worktree is `project`; these are the git binds (docs/worktrees.md).
    worktree: AgentTree | None = None


def place_agent(project_id: int, cwd: str, agent_name: str) -> Placement:
    """The project's directory checked again (the rules of the API and the admin), and its owner's
    state directory for this agent; ProjectPathRefused if the path is refused now.

    A path saved under older rules, a root the operator removed since, or two users' projects
    saved overlapping at the same instant never become an agent's working directory.
    """
    owner_id = Project.objects.filter(pk=project_id).values_list("owner_id", flat=True).first()
    if owner_id is None:
        raise ProjectPathRefused(f"Project {project_id} no longer exists.")
    tree = agent_tree(project_id, cwd)  # a worktree session's: its project is checked all the same
    try:
        resolved = validate_project_location(
            str(tree.project) if tree else cwd, owner_id=owner_id, project_id=project_id
        )
    except PathRefused as exc:
        raise ProjectPathRefused(f"The project's directory is refused ({exc.code}): {exc.message}") from None
    state_dir = agent_state_dir(settings.DATA_DIR, owner_id, agent_name)
    return Placement(tree.path, state_dir, tree) if tree else Placement(resolved, state_dir)


class Agents(Protocol):
    """What executions and agent jobs use of the pool: borrow a project's agent process, give it back."""

    async def acquire(self, spec: AgentSpec, project_id: int, cwd: str) -> AgentProcess: ...

    async def release(self, process: AgentProcess) -> None: ...


class SessionSink(Protocol):
    """Whoever listens on an agent session: a run's execution, or an import's collector."""

    def on_update(self, update: Any) -> None: ...

    async def on_permission(self, tool_call: Any, options: list[Any]) -> schema.RequestPermissionResponse: ...

    async def on_elicitation(self, message: str, mode: Any) -> Any: ...


class _Client(ClientFilesAndTerminals):
    """The ACP `Client` the agent talks to; every call is routed by agent session id (files and
    terminals: client_methods.py)."""

    def __init__(self, process: AgentProcess) -> None:
        self.process = process

    def on_connect(self, conn: Any) -> None:
        pass

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.process.route_update(session_id, update)

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any
    ) -> schema.RequestPermissionResponse:
        sink = self.process.sinks.get(session_id)
        if sink is None:
            # No run is watching: never grant on anyone's behalf.
            return schema.RequestPermissionResponse(outcome=schema.DeniedOutcome(outcome="cancelled"))
        return await sink.on_permission(tool_call, options)

    async def create_elicitation(self, message: str, mode: Any, **kwargs: Any) -> Any:
        session_id = getattr(getattr(mode, "root", mode), "session_id", None)
        sink = self.process.sinks.get(session_id) if session_id else None
        if sink is None:
            return schema.CancelElicitationResponse(action="cancel")
        return await sink.on_elicitation(message, getattr(mode, "root", mode))

    async def complete_elicitation(self, elicitation_id: str, **kwargs: Any) -> None:
        return None

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        raise acp.RequestError.method_not_found(method)

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        return None


class AgentProcess:
    def __init__(
        self, spec: AgentSpec, project_id: int, cwd: str, placement: Placement | None = None
    ) -> None:
        self.spec = spec
        self.project_id = project_id
        self.cwd = cwd
        # Where it runs, checked by the pool (place_agent); needed to start.
        self.placement = placement
        # What GET /api/agents shows comes from runners; `doctor` reads the database only.
        self.reports_to_catalog = True
        self.sandboxed = False
        self.conn: Any = None
        self.process: asyncio.subprocess.Process | None = None
        self.capabilities: dict[str, Any] = {}
        self.sinks: dict[str, SessionSink] = {}
        self.loaded: set[str] = set()
        self.loading: set[str] = set()
        self.commands: dict[str, Any] = {}
        # Agent session id → its modes and models as the agent has them now (session_config.py).
        self.configs: dict[str, AgentSessionConfig] = {}
        self.transport: StdioTransport | None = None
        # Agent session id → the commands last written to its Session row from this process.
        self.stored_commands: dict[str, list[dict[str, Any]]] = {}
        self.active = 0
        self.last_used = time.monotonic()
        self.poisoned = ""
        self.closing = False
        self.exited = asyncio.Event()
        self._cm: Any = None
        self._log: Any = None
        self._watch: asyncio.Task[None] | None = None
        self.on_orphan_update: Any = None
        # The runs this process serves now (their executions add and remove themselves).
        self.runs: set[int] = set()
        self.network_refused = 0
        self._proxy: NetworkProxy | None = None
        self._proxy_dir: Path | None = None
        self._refusal_tasks: set[asyncio.Task[None]] = set()
        # ACP terminals the agent asked for, run in its sandbox (terminals.py).
        self.terminals = Terminals(lambda command, args: launch_like_agent(self, command, args))

    @property
    def alive(self) -> bool:
        return self.conn is not None and not self.exited.is_set()

    @property
    def project_dir(self) -> Path | None:
        return self.placement.project if self.placement is not None else None

    @property
    def proxy_dir(self) -> Path | None:
        return self._proxy_dir

    @property
    def log_path(self) -> Path:
        return Path(settings.HERMESWEB_LOG_DIR) / f"agent-{self.spec.name}-project{self.project_id}.log"

    async def start(self) -> None:
        command = self.spec.resolved_command()
        if command is None:
            raise AgentDied(
                f"agent {self.spec.name!r}: command {self.spec.command!r} not found or not executable"
            )
        if self.placement is None:
            raise AgentDied(f"agent {self.spec.name!r}: no checked project directory to start in")
        try:
            policy = policy_for(self.spec.network)
            # Off the loop: it makes directories, may copy files, and tries bwrap once per process.
            if policy.proxied and (await asyncio.to_thread(agents.sandboxed, self.spec))[0]:
                await self._start_proxy(policy)
            launch = await asyncio.to_thread(
                sandbox.prepare,
                self.spec,
                command,
                cwd=self.cwd,
                project=self.placement.project,
                state_dir=self.placement.state_dir,
                data_dir=settings.DATA_DIR,
                roots=settings.HERMESWEB_ALLOWED_ROOTS,
                network=policy,
                proxy_dir=self._proxy_dir,
                worktree=self.placement.worktree,
            )
        except (sandbox.SandboxUnavailable, OSError, ValueError) as exc:
            await self._stop_proxy()
            raise AgentDied(f"agent {self.spec.name!r} cannot start: {exc}") from None
        if not launch.sandboxed:
            log.warning(
                "agent %s for project %s runs UNSANDBOXED: %s",
                self.spec.name,
                self.project_id,
                launch.unsandboxed_because,
            )
        # stderr goes to a file, redacted a line at a time by a thread (an unread pipe would
        # fill and block the agent).
        self._log = RedactedLog(self.log_path)
        try:
            await self._spawn(launch)
        finally:
            launch.close_fds()  # the child has its copies; bwrap mounted them
            self._log.close_writer()
        self._watch = asyncio.get_running_loop().create_task(self._wait_exit())
        try:
            response = await asyncio.wait_for(self._initialize(), INITIALIZE_TIMEOUT)
        except (TimeoutError, Exception) as exc:
            await self.close()
            raise AgentDied(f"agent {self.spec.name!r} failed to initialize: {exc!r}") from exc
        self.capabilities = self._summarise(response)
        # What GET /api/agents shows of this agent (runs/agent_catalog.py); never fails the start.
        if self.reports_to_catalog:
            await sync_to_async(revived(agent_catalog.record_initialize))(self.spec.name, as_dict(response))
        # Shown by /api/health: an agent a runner started unsandboxed.
        self.capabilities["sandbox"] = "bubblewrap" if launch.sandboxed else "none"
        log.info(
            "agent %s started for project %s (pid %s)", self.spec.name, self.project_id, self.process.pid
        )

    async def _start_proxy(self, policy: NetworkPolicy) -> None:
        """This agent's way out: a filtering proxy on a socket only its sandbox gets."""
        account = await asyncio.to_thread(agent_account)
        owner = (account.uid, account.gid) if account is not None else None
        self._proxy_dir = private_socket_dir(owner=owner).resolve()
        self._proxy = NetworkProxy(
            policy,
            self._proxy_dir / sandbox.PROXY_SOCKET,
            agent=self.spec.name,
            project=str(self.project_id),
            on_refused=self._refused,
            owner=owner,
        )
        await self._proxy.start()

    async def _stop_proxy(self) -> None:
        proxy, self._proxy = self._proxy, None
        if proxy is not None:
            await proxy.close()
        if self._proxy_dir is not None:
            shutil.rmtree(self._proxy_dir, ignore_errors=True)
            self._proxy_dir = None

    def _refused(self, refusal: Refusal) -> None:
        """Counted on every turn this agent serves now, where its user sees it (the run's status)."""
        self.network_refused += 1
        if self.runs:
            task = asyncio.get_running_loop().create_task(self._count_refusal(set(self.runs)))
            self._refusal_tasks.add(task)
            task.add_done_callback(self._refusal_tasks.discard)

    @staticmethod
    async def _count_refusal(run_ids: set[int]) -> None:
        # Once, not retried: an increment tried twice might count twice.
        try:
            await sync_to_async(revived(Run.objects.count_network_refusal))(run_ids)
        except Exception:
            log.warning("counting a refused connection on runs %s failed", sorted(run_ids), exc_info=True)

    async def _spawn(self, launch: sandbox.Launch) -> None:
        assert self._log is not None
        self._cm = spawn_agent(
            _Client(self),
            launch.command,
            *launch.args,
            env=launch.env,
            cwd=self.cwd,
            stderr=self._log.fd,
            limit=STDIO_LIMIT,
            on_session_update=self.route_update,
            on_session_opened=lambda session_id, result: record_opened(self.configs, session_id, result),
            pass_fds=launch.fds,
        )
        self.sandboxed = launch.sandboxed
        self.conn, self.process, self.transport = await self._cm.__aenter__()

    async def _initialize(self) -> Any:
        init = self.conn.initialize(
            protocol_version=acp.PROTOCOL_VERSION,
            client_capabilities=schema.ClientCapabilities(
                elicitation=schema.ElicitationCapabilities(form=schema.ElicitationFormCapabilities()),
                fs=FS_CAPABILITIES,
                terminal=True,
            ),
            client_info=schema.Implementation(name="hermesweb", version="0.1.0"),
        )
        waiter = asyncio.ensure_future(self.exited.wait())
        task = asyncio.ensure_future(init)
        done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if task not in done:
            task.cancel()
            raise AgentDied("agent exited during initialize")
        return task.result()

    def _summarise(self, response: Any) -> dict[str, Any]:
        data = response.model_dump(by_alias=True, exclude_none=True, mode="json")
        meta = data.get("_meta") or {}
        steer = self.spec.steer
        if steer == "auto":
            steer = detected_steer((data.get("agentInfo") or {}).get("name"), meta)
        caps = data.get("agentCapabilities", {})
        return {
            "agent_info": data.get("agentInfo", {}),
            "load_session": bool(caps.get("loadSession")),
            "session_capabilities": caps.get("sessionCapabilities", {}),
            "prompt_capabilities": caps.get("promptCapabilities", {}),
            "steer": steer if steer != "none" else False,
            "goal": False,
        }

    async def _wait_exit(self) -> None:
        assert self.process is not None
        with contextlib.suppress(Exception):
            await self.process.wait()
        self.exited.set()
        level = logging.INFO if self.closing else logging.WARNING
        name, project, code = self.spec.name, self.project_id, self.returncode
        log.log(level, "agent %s for project %s exited (code %s)", name, project, code)

    def route_update(self, session_id: str, update: Any) -> None:
        """Hand an update to the run (or job) listening on its session: the agent's JSON, or a model."""
        if isinstance(update, dict):
            kind = update.get("sessionUpdate")
        else:
            kind = getattr(update, "session_update", None)
        if kind == "current_mode_update":
            record_mode_update(self.configs, session_id, as_dict(update))
        if kind == "config_option_update":
            record_config_update(self.configs, session_id, as_dict(update))
        if kind == "available_commands_update":
            # Often sent during session/new or load, before any run listens: keep the latest.
            self.commands[session_id] = update
            if self.spec.steer == "auto" and not self.capabilities.get("steer"):
                names = [c.get("name") for c in as_dict(update).get("availableCommands", [])]
                steer = detected_steer(None, {}, names)
                self.capabilities["steer"] = steer if steer != "none" else False
        if session_id in self.loading:
            return  # history replay of session/load: the journal already has it
        sink = self.sinks.get(session_id)
        if sink is not None:
            sink.on_update(update)
        elif self.on_orphan_update is not None:
            self.on_orphan_update(self, session_id, update)

    async def call(self, coro: Any, timeout: float | None = None) -> Any:
        """Await an ACP request, failing fast with AgentDied if the process exits meanwhile."""
        task = asyncio.ensure_future(coro)
        waiter = asyncio.ensure_future(self.exited.wait())
        try:
            done, _ = await asyncio.wait({task, waiter}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            # The caller gave up (a cancel deadline, an abort): drop the request with it, or its
            # failure when the process is retired is an exception nobody retrieves.
            task.cancel()
            raise
        finally:
            waiter.cancel()
        if task in done:
            exc = task.exception()
            if isinstance(exc, (ConnectionError, EOFError)):
                # The SDK fails pending requests with ConnectionError when the pipe closes.
                raise AgentDied(f"agent {self.spec.name!r} connection closed: {exc}") from exc
            return task.result()
        task.cancel()
        if self.exited.is_set():
            raise AgentDied(f"agent {self.spec.name!r} exited (code {self.returncode})")
        raise TimeoutError

    async def raw_request(self, method: str, params: dict[str, Any]) -> Any:
        """A JSON-RPC request outside the SDK's typed API (`session/set_model`); await it via call()."""
        if self.transport is None:
            raise AgentDied(f"agent {self.spec.name!r} is not running")
        return await self.transport.request(method, params)

    @property
    def returncode(self) -> int | None:
        return self.process.returncode if self.process else None

    async def close(self) -> None:
        self.closing = True
        self.terminals.release_all()
        if self._cm is not None:
            cm, self._cm = self._cm, None
            with contextlib.suppress(Exception):
                await asyncio.wait_for(cm.__aexit__(None, None, None), 10)
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
        if self._log is not None:
            self._log.close_writer()
            self._log = None
        await self._stop_proxy()
        self.exited.set()


class AgentPool:
    def __init__(self) -> None:
        self.processes: dict[tuple[int, str], AgentProcess] = {}
        self._locks: dict[tuple[int, str], asyncio.Lock] = {}
        self.on_started: Any = None
        self.on_orphan_update: Any = None

    async def acquire(self, spec: AgentSpec, project_id: int, cwd: str) -> AgentProcess:
        key = (project_id, spec.name)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            current = self.processes.get(key)
            # A project whose directory changed gets a new process (checked, sandboxed there).
            if current is not None and current.alive and not current.poisoned and current.cwd == cwd:
                current.active += 1
                current.last_used = time.monotonic()
                return current
            if current is not None and current.cwd != cwd:
                current.poisoned = "project directory changed"  # retired when its turns end
            if current is not None and current.active == 0:
                await current.close()
            placement = await retried(place_agent, project_id, cwd, spec.name)
            process = AgentProcess(spec, project_id, cwd, placement)
            process.on_orphan_update = self.on_orphan_update
            await process.start()
            self.processes[key] = process
            process.active += 1
            if self.on_started is not None:
                await self.on_started(process)
            return process

    async def release(self, process: AgentProcess) -> None:
        process.active -= 1
        process.last_used = time.monotonic()
        if process.active <= 0 and (process.poisoned or not process.alive):
            await self._retire(process)

    async def _retire(self, process: AgentProcess) -> None:
        key = (process.project_id, process.spec.name)
        if self.processes.get(key) is process:
            del self.processes[key]
        await process.close()

    async def retire_idle(self, process: AgentProcess) -> bool:
        """Stop `process` unless a turn holds it (the memory budget's choice, runs/runner/memory.py)."""
        if process.active > 0 or self.processes.get((process.project_id, process.spec.name)) is not process:
            return False
        await self._retire(process)
        return True

    async def reap_idle(self, idle_seconds: float) -> None:
        now = time.monotonic()
        for process in list(self.processes.values()):
            if process.active <= 0 and (not process.alive or now - process.last_used > idle_seconds):
                await self._retire(process)

    async def close_all(self) -> None:
        for process in list(self.processes.values()):
            await self._retire(process)
