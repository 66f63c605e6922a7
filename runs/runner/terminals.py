"""ACP's terminals: commands an agent asks the client to run, in the agent's own sandbox.

Design note: docs/runner.md ("Client capabilities"). `terminal/create` starts the command the
way the agent itself was started (runs/runner/sandbox.py: the same bubblewrap, account, network
and binds, the project as cwd): the agent's launch with its command swapped for this one. Its
output (stdout and stderr together) is kept for `terminal/output`, cut from the start to the
agent's `outputByteLimit` at a character boundary, and journaled as it arrives as
`terminal.output` deltas the writer coalesces like text, so the tool card showing the terminal
fills live. A terminal belongs to its session's running turn: Stop kills it, the turn's end
releases it. Each starts in a process group of its own, and bwrap's `--die-with-parent` takes
the whole sandbox down when the runner dies, even by SIGKILL: no orphan is left.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import logging
import os
import signal
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import acp
from acp import schema

from runs.journal import NewEvent
from runs.journal.payloads import TerminalOutput
from runs.models import EventType
from runs.runner.sandbox import Launch

log = logging.getLogger(__name__)

# What a terminal keeps when the agent gives no outputByteLimit, and what is journaled of one at
# most: a command that prints without end must not grow the runner or the journal without end.
DEFAULT_OUTPUT_LIMIT = 1024 * 1024
JOURNAL_LIMIT = 256 * 1024
JOURNAL_CUT = "\n[output cut: more than the journal keeps of a terminal]\n"
READ_CHUNK = 64 * 1024
MAX_TERMINALS = 16  # per agent process at once

# The agent's launch for another command: (argv[0], argv[1:], env, fds) ready to spawn.
Launcher = Callable[[str, list[str]], Awaitable[Launch]]


def cut_from_start(text: str, limit: int) -> tuple[str, bool]:
    """`text` without its start so that its UTF-8 is at most `limit` bytes, cut at a character."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text, False
    tail = data[len(data) - limit :] if limit > 0 else b""
    start = 0
    while start < len(tail) and tail[start] & 0xC0 == 0x80:
        start += 1  # a continuation byte: the character began before the cut
    return tail[start:].decode("utf-8", errors="replace"), True


def exit_status(returncode: int | None) -> schema.TerminalExitStatus | None:
    if returncode is None:
        return None
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        return schema.TerminalExitStatus(exit_code=None, signal=name)
    return schema.TerminalExitStatus(exit_code=returncode, signal=None)


@dataclass
class Terminal:
    """One command's process, its kept output and where its deltas are journaled."""

    id: str
    session_id: str
    process: asyncio.subprocess.Process
    limit: int
    journal: Callable[[list[NewEvent]], None] | None
    output: str = ""
    truncated: bool = False
    journaled: int = 0
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    reader: asyncio.Task[None] | None = None

    def take(self, text: str) -> None:
        self.output, cut = cut_from_start(self.output + text, self.limit)
        self.truncated = self.truncated or cut
        if self.journal is None or self.journaled >= JOURNAL_LIMIT:
            return
        room = JOURNAL_LIMIT - self.journaled
        piece = text if len(text) <= room else text[:room] + JOURNAL_CUT
        self.journaled += len(piece)
        self.journal([NewEvent(EventType.TERMINAL_OUTPUT, TerminalOutput(terminal_id=self.id, delta=piece))])

    async def read(self) -> None:
        assert self.process.stdout is not None
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            while chunk := await self.process.stdout.read(READ_CHUNK):
                if text := decoder.decode(chunk):
                    self.take(text)
            if rest := decoder.decode(b"", final=True):
                self.take(rest)
        finally:
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                await self.process.wait()
            self.exited.set()

    def kill(self) -> None:
        """SIGKILL the terminal's process group (bwrap and, through its death, the whole sandbox)."""
        if self.process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)


class Terminals:
    """An agent process's terminals, by id; each belongs to one agent session."""

    def __init__(self, launcher: Launcher) -> None:
        self.launcher = launcher
        self.open: dict[str, Terminal] = {}

    def _get(self, session_id: str, terminal_id: str) -> Terminal:
        terminal = self.open.get(terminal_id)
        if terminal is None or terminal.session_id != session_id:
            raise acp.RequestError.resource_not_found(terminal_id)
        return terminal

    async def create(
        self,
        session_id: str,
        command: str,
        args: list[str],
        env: dict[str, str],
        chdir: str,
        output_byte_limit: int | None,
        journal: Callable[[list[NewEvent]], None] | None,
        workdir: str,
    ) -> schema.CreateTerminalResponse:
        """Start `command args` in the agent's sandbox; `chdir` a directory below the project ("" for it).

        `workdir` is the agent's own cwd: bwrap enters the project itself (`--chdir`); an
        unsandboxed agent's command starts there."""
        if len(self.open) >= MAX_TERMINALS:
            raise acp.RequestError.invalid_request({"message": f"At most {MAX_TERMINALS} terminals at once."})
        if not command:
            raise acp.RequestError.invalid_params({"message": "No command."})
        if not args and any(c.isspace() for c in command):
            # A command line in one string (what several agents send): the shell splits it.
            command, args = "/bin/sh", ["-c", command]
        if chdir:
            command, args = "/usr/bin/env", ["-C", chdir, "--", command, *args]
        launch = await self.launcher(command, args)
        try:
            process = await asyncio.create_subprocess_exec(
                launch.command,
                *launch.args,
                env={**launch.env, **env},
                cwd=workdir,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                pass_fds=launch.fds,
                start_new_session=True,  # its own process group: kill takes all of it
            )
        except OSError as exc:
            raise acp.RequestError.internal_error(
                {"message": f"cannot start {command}: {exc.strerror}"}
            ) from None
        finally:
            launch.close_fds()
        limit = DEFAULT_OUTPUT_LIMIT if output_byte_limit is None else max(0, output_byte_limit)
        terminal = Terminal(f"term-{uuid.uuid4().hex[:12]}", session_id, process, limit, journal)
        terminal.reader = asyncio.get_running_loop().create_task(terminal.read())
        self.open[terminal.id] = terminal
        log.info("terminal %s started for session %s (pid %s)", terminal.id, session_id, process.pid)
        return schema.CreateTerminalResponse(terminal_id=terminal.id)

    def output(self, session_id: str, terminal_id: str) -> schema.TerminalOutputResponse:
        terminal = self._get(session_id, terminal_id)
        status = exit_status(terminal.process.returncode) if terminal.exited.is_set() else None
        return schema.TerminalOutputResponse(
            output=terminal.output, truncated=terminal.truncated, exit_status=status
        )

    async def wait_for_exit(self, session_id: str, terminal_id: str) -> schema.WaitForTerminalExitResponse:
        terminal = self._get(session_id, terminal_id)
        await terminal.exited.wait()
        status = exit_status(terminal.process.returncode)
        return schema.WaitForTerminalExitResponse(
            exit_code=status.exit_code if status else None, signal=status.signal if status else None
        )

    def kill(self, session_id: str, terminal_id: str) -> schema.KillTerminalResponse:
        self._get(session_id, terminal_id).kill()
        return schema.KillTerminalResponse()

    def release(self, session_id: str, terminal_id: str) -> schema.ReleaseTerminalResponse:
        terminal = self._get(session_id, terminal_id)
        terminal.kill()
        terminal.journal = None  # what it prints while dying is no longer the turn's
        del self.open[terminal_id]
        return schema.ReleaseTerminalResponse()

    def kill_session(self, session_id: str) -> int:
        """Stop: kill every terminal of the session (kept for their output until released)."""
        killed = [t for t in self.open.values() if t.session_id == session_id]
        for terminal in killed:
            terminal.kill()
        return len(killed)

    def release_session(self, session_id: str) -> None:
        """The turn ended: its terminals are killed and forgotten."""
        for terminal_id in [t.id for t in self.open.values() if t.session_id == session_id]:
            self.release(session_id, terminal_id)

    def release_all(self) -> None:
        for terminal in list(self.open.values()):
            self.release(terminal.session_id, terminal.id)


def env_of(variables: list[Any] | None) -> dict[str, str]:
    """ACP's [{name, value}] as a mapping (NUL-free names and values only)."""
    out: dict[str, str] = {}
    for variable in variables or []:
        name, value = getattr(variable, "name", ""), getattr(variable, "value", "")
        if not name or "=" in name or "\x00" in name or "\x00" in value:
            raise acp.RequestError.invalid_params({"message": f"bad environment variable {name!r}"})
        out[name] = value
    return out
