"""The ACP client methods for files and terminals, as the runner's `Client` answers them.

Design note: docs/runner.md ("Client capabilities"). `ClientFilesAndTerminals` is mixed into
the client of runs/runner/agents.py; each call is routed by agent session id to its agent
process: the files through client_fs.py, the terminals through terminals.py, started by
`launch_like_agent` in the sandbox the agent itself runs in. A file is written and a command
run only while a turn of that session runs (client_fs.require_turn).
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any, Protocol

from acp import schema
from django.conf import settings

from runs.agents import AgentSpec
from runs.runner import sandbox
from runs.runner.client_fs import ProjectFiles, project_files, read_text_file, require_turn, write_text_file
from runs.runner.netpolicy import policy_for
from runs.runner.terminals import Terminals, env_of

# What the runner offers in `initialize` (besides elicitation).
FS_CAPABILITIES = schema.FileSystemCapabilities(read_text_file=True, write_text_file=True)


class PlacedAgent(Protocol):
    """What these methods use of an agent process (runs/runner/agents.py AgentProcess)."""

    spec: AgentSpec
    cwd: str
    sinks: dict[str, Any]
    terminals: Terminals

    @property
    def project_dir(self) -> Path | None: ...

    @property
    def proxy_dir(self) -> Path | None: ...


def files_of(process: PlacedAgent) -> ProjectFiles | None:
    return project_files(process.project_dir, process.cwd)


async def launch_like_agent(process: PlacedAgent, command: str, args: list[str]) -> sandbox.Launch:
    """The agent's own launch (sandbox, account, network, binds, the project as cwd) for `command args`.

    prepare() is given the agent's command (what it binds of the agent's installation follows
    from it) with no arguments, and that command, last in the line, is swapped for this one.
    """
    project = process.project_dir
    agent_command = process.spec.resolved_command()
    if project is None or agent_command is None:
        raise OSError("the agent is not placed")
    launch = await asyncio.to_thread(
        sandbox.prepare,
        dataclasses.replace(process.spec, args=[]),
        agent_command,
        cwd=process.cwd,
        project=project,
        state_dir=_state_dir(process),
        data_dir=settings.DATA_DIR,
        roots=settings.HERMESWEB_ALLOWED_ROOTS,
        network=policy_for(process.spec.network),
        proxy_dir=process.proxy_dir,
    )
    if launch.sandboxed:
        argv = [launch.command, *launch.args]
        if argv[-1] != agent_command:
            launch.close_fds()
            raise OSError("the agent's launch does not end with its command")
        argv = [*argv[:-1], command, *args]
        return dataclasses.replace(launch, command=argv[0], args=argv[1:])
    return dataclasses.replace(launch, command=command, args=list(args))


def _state_dir(process: Any) -> Path:
    placement = getattr(process, "placement", None)
    if placement is None:
        raise OSError("the agent is not placed")
    return Path(placement.state_dir)


class ClientFilesAndTerminals:
    """fs/* and terminal/* of ACP's Client interface, for the client of one agent process."""

    process: Any  # a PlacedAgent

    async def read_text_file(
        self, session_id: str, path: str, line: int | None = None, limit: int | None = None, **kwargs: Any
    ) -> schema.ReadTextFileResponse:
        return await read_text_file(files_of(self.process), path, line, limit)

    async def write_text_file(
        self, session_id: str, path: str, content: str, **kwargs: Any
    ) -> schema.WriteTextFileResponse:
        sink = self.process.sinks.get(session_id)
        return await write_text_file(files_of(self.process), sink, path, content)

    async def create_terminal(
        self,
        session_id: str,
        command: str,
        args: list[str] | None = None,
        env: list[Any] | None = None,
        cwd: str | None = None,
        output_byte_limit: int | None = None,
        **kwargs: Any,
    ) -> schema.CreateTerminalResponse:
        sink = self.process.sinks.get(session_id)
        require_turn(sink)
        files = files_of(self.process)
        chdir = files.directory(cwd) if files is not None and cwd else ""
        writer = getattr(sink, "writer", None)
        return await self.process.terminals.create(
            session_id,
            command,
            list(args or []),
            env_of(env),
            chdir,
            output_byte_limit,
            writer.add if writer is not None else None,
            self.process.cwd,
        )

    async def terminal_output(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> schema.TerminalOutputResponse:
        return self.process.terminals.output(session_id, terminal_id)

    async def wait_for_terminal_exit(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> schema.WaitForTerminalExitResponse:
        return await self.process.terminals.wait_for_exit(session_id, terminal_id)

    async def kill_terminal(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> schema.KillTerminalResponse:
        return self.process.terminals.kill(session_id, terminal_id)

    async def release_terminal(
        self, session_id: str, terminal_id: str, **kwargs: Any
    ) -> schema.ReleaseTerminalResponse:
        return self.process.terminals.release(session_id, terminal_id)
