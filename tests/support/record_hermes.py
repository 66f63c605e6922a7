"""Record real Hermes ACP traffic as JSON-lines fixtures.

    python -m tests.support.record_hermes OUTDIR [SCENARIO ...]

Each scenario starts a ScriptedLLM, gives `hermes-acp` its own temp `HERMES_HOME` and `HOME`,
drives it over stdio with the ACP SDK client exactly as the runner would (same `initialize`),
and writes every JSON-RPC message in both directions, in wire order, to `OUTDIR/<scenario>.jsonl`.
Volatile values are replaced by stable placeholders so that re-recording gives a minimal diff:
the ACP session id (`<session-1>`), temp paths (`<cwd>`, `<hermes-home>`, `<home>`, `<tmp>`),
Hermes' random tool-call ids (`tc-<1>`), timestamps (`<timestamp>`) and the model server's port.

Line format: `{"from": "client" | "agent", ...the message without "jsonrpc"}`; a scenario that
starts a second agent process (recovery after a jam) writes `{"spawn": N}` before its messages.

The stored traces (tests/fixtures/hermes/) feed tests/test_hermes_traces.py. Run this by hand
after a Hermes upgrade (see tests/fixtures/hermes/README.md); CI runs only one scenario, live,
to notice a change of shape.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import acp
from acp import text_block
from acp.connection import StreamDirection, StreamEvent
from acp.schema import (
    ClientCapabilities,
    ElicitationCapabilities,
    ElicitationFormCapabilities,
    Implementation,
)

from tests.support.acp_client import RecordingClient
from tests.support.hermes import ensure_hermes_acp, hermes_agent_config, spawn_kwargs
from tests.support.scripted_llm import ScriptedLLM, reasoning, text, tool_call

STEP_TIMEOUT = 60.0
# Hermes' title (a side call after the first turn) and its late updates; generous for a busy box.
LATE_TIMEOUT = 20.0
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hermes"

# A terminal command that blocks until the recorder creates `release` in the cwd: the turn is
# provably inside the tool when the cancel is sent, and the shell never outlives the scenario.
BLOCKING_COMMAND = "while [ ! -e release ]; do sleep 0.05; done; echo released"

_TOOL_ID = re.compile(r"\btc-[0-9a-f]{12}\b")
_TIMESTAMP = re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?")
# Hermes' internal session ids (`_meta.hermes.sessionProvenance`): `20260101_120000_ab12cd`.
_HERMES_SESSION = re.compile(r"\b\d{8}_\d{6}_[0-9a-f]{6,}\b")


class Normaliser:
    """Replaces the values that change on every recording with stable placeholders."""

    def __init__(self) -> None:
        self.literals: list[tuple[str, str]] = []
        self.tool_ids: dict[str, str] = {}
        self.hermes_ids: dict[str, str] = {}
        self.sessions: dict[str, str] = {}

    def add(self, value: str, placeholder: str) -> None:
        if value and all(value != known for known, _ in self.literals):
            self.literals.append((value, placeholder))
            # Longest first: a workspace path must win over the temp root that contains it.
            self.literals.sort(key=lambda pair: len(pair[0]), reverse=True)

    def add_session(self, session_id: str) -> None:
        if session_id and session_id not in self.sessions:
            placeholder = f"<session-{len(self.sessions) + 1}>"
            self.sessions[session_id] = placeholder
            self.add(session_id, placeholder)

    def string(self, value: str) -> str:
        for literal, placeholder in self.literals:
            if literal in value:
                value = value.replace(literal, placeholder)
        value = _TOOL_ID.sub(lambda m: self._numbered(self.tool_ids, m.group(0), "tc-<{}>"), value)
        value = _HERMES_SESSION.sub(
            lambda m: self._numbered(self.hermes_ids, m.group(0), "<hermes-session-{}>"), value
        )
        return _TIMESTAMP.sub("<timestamp>", value)

    @staticmethod
    def _numbered(table: dict[str, str], value: str, pattern: str) -> str:
        if value not in table:
            table[value] = pattern.format(len(table) + 1)
        return table[value]

    def __call__(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.string(value)
        if isinstance(value, list):
            return [self(item) for item in value]
        if isinstance(value, dict):
            return {self.string(key): self(item) for key, item in value.items()}
        return value


@dataclass
class Agent:
    """One initialized hermes-acp process, and helpers that wait the way the scenarios need."""

    conn: acp.ClientSideConnection
    client: RecordingClient
    cwd: Path
    recording: Recording

    async def new_session(self) -> str:
        since = self.client.mark()
        async with asyncio.timeout(STEP_TIMEOUT):
            response = await self.conn.new_session(cwd=str(self.cwd), mcp_servers=[])
        self.recording.normaliser.add_session(response.session_id)
        # Hermes schedules its commands and a usage gauge just after answering: wait for them, so
        # they never land inside the first turn.
        await self.wait_kind("available_commands_update", since=since)
        await self.settle()
        return response.session_id

    async def load_session(self, session_id: str) -> None:
        since = self.client.mark()
        async with asyncio.timeout(STEP_TIMEOUT):
            await self.conn.load_session(cwd=str(self.cwd), session_id=session_id, mcp_servers=[])
        await self.wait_kind("available_commands_update", since=since)
        await self.settle()

    async def prompt(self, session_id: str, message: str) -> Any:
        async with asyncio.timeout(STEP_TIMEOUT):
            return await self.conn.prompt(session_id=session_id, prompt=[text_block(message)])

    async def wait_kind(self, kind: str, *, since: int = 0, timeout: float = STEP_TIMEOUT) -> Any:
        return await self.client.wait_for(lambda u: u.session_update == kind, since=since, timeout=timeout)

    async def settle(self, quiet: float = 0.5) -> None:
        """Wait until the agent has been silent for `quiet` seconds (late usage/title updates)."""
        while True:
            count = len(self.recording.lines)
            await asyncio.sleep(quiet)
            if len(self.recording.lines) == count:
                return


@dataclass
class Recording:
    root: Path
    llm: ScriptedLLM
    command: Path
    normaliser: Normaliser = field(default_factory=Normaliser)
    lines: list[dict[str, Any]] = field(default_factory=list)
    spawns: int = 0

    @property
    def workspace(self) -> Path:
        return self.root / "workspace"

    def observe(self, event: StreamEvent) -> None:
        sender = "client" if event.direction is StreamDirection.OUTGOING else "agent"
        message = {key: value for key, value in event.message.items() if key != "jsonrpc"}
        self.lines.append({"from": sender, **message})

    @asynccontextmanager
    async def agent(self, client: RecordingClient | None = None) -> AsyncIterator[Agent]:
        """Spawn hermes-acp (a fresh process each time) and initialize it as the runner does."""
        self.spawns += 1
        if self.spawns > 1:
            self.lines.append({"spawn": self.spawns})
        client = client or RecordingClient()
        config = hermes_agent_config(self.root / "hermes", self.llm, command=self.command)
        self.normaliser.add(config["env"]["HERMES_HOME"], "<hermes-home>")
        self.normaliser.add(config["env"]["HOME"], "<home>")
        with (self.root / "hermes.stderr").open("ab") as stderr:
            kwargs = spawn_kwargs(config, stderr)
            async with acp.spawn_agent_process(
                client, config["command"], cwd=self.workspace, observers=[self.observe], **kwargs
            ) as (conn, _process):
                async with asyncio.timeout(STEP_TIMEOUT):
                    # The runner's initialize (runs/runner/agents.py), so the trace is what it sees.
                    await conn.initialize(
                        protocol_version=acp.PROTOCOL_VERSION,
                        client_capabilities=ClientCapabilities(
                            elicitation=ElicitationCapabilities(form=ElicitationFormCapabilities()),
                        ),
                        client_info=Implementation(name="hermesweb", version="0.1.0"),
                    )
                yield Agent(conn, client, self.workspace, self)

    def normalised(self) -> list[dict[str, Any]]:
        return [self.normaliser(line) for line in self.lines]


# ---------------------------------------------------------------------------- scenarios

ScenarioFn = Callable[[Recording], Awaitable[None]]


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    run: ScenarioFn


async def _text(rec: Recording) -> None:
    rec.llm.enqueue(text("Hello from the scripted model, streamed in several chunks.", chunks=6))
    async with rec.agent() as agent:
        session = await agent.new_session()
        since = agent.client.mark()
        await agent.prompt(session, "Say hello")
        # The auto-title is a side call Hermes makes after the first turn; wait for it.
        await agent.wait_kind("session_info_update", since=since, timeout=LATE_TIMEOUT)
        await agent.settle()


async def _thought(rec: Recording) -> None:
    rec.llm.enqueue(reasoning("The user wants foxes. Keep it short.", "Foxes are small omnivores.", chunks=3))
    async with rec.agent() as agent:
        session = await agent.new_session()
        since = agent.client.mark()
        await agent.prompt(session, "Tell me about foxes")
        await agent.wait_kind("session_info_update", since=since, timeout=LATE_TIMEOUT)
        await agent.settle()


async def _tool(rec: Recording) -> None:
    rec.llm.enqueue(
        tool_call("terminal", {"command": "echo hello from the tool"}, call_id="call_tool_1"),
        text("The command printed a greeting.", chunks=2),
    )
    async with rec.agent() as agent:
        session = await agent.new_session()
        since = agent.client.mark()
        await agent.prompt(session, "Run echo")
        await agent.wait_kind("session_info_update", since=since, timeout=LATE_TIMEOUT)
        await agent.settle()


_TODOS = [
    {"id": "1", "content": "Read the code", "status": "in_progress"},
    {"id": "2", "content": "Fix the bug", "status": "pending"},
    {"id": "3", "content": "Run the tests", "status": "pending"},
]


async def _plan(rec: Recording) -> None:
    # Hermes 0.19 emits `plan` only from its `todo` tool: the tool's result becomes the plan.
    progressed = [
        {"id": "1", "content": "Read the code", "status": "completed"},
        {"id": "2", "content": "Fix the bug", "status": "in_progress"},
    ]
    rec.llm.enqueue(
        tool_call("todo", {"todos": _TODOS}, call_id="call_todo_1"),
        tool_call("todo", {"todos": progressed, "merge": True}, call_id="call_todo_2"),
        text("Planned and started.", chunks=2),
    )
    async with rec.agent() as agent:
        session = await agent.new_session()
        since = agent.client.mark()
        await agent.prompt(session, "Plan the fix")
        await agent.wait_kind("session_info_update", since=since, timeout=LATE_TIMEOUT)
        await agent.settle()


async def _permission(rec: Recording, answer: str) -> None:
    (rec.workspace / "doomed").mkdir()
    (rec.workspace / "doomed" / "keep.txt").write_text("precious\n")
    # `rm -rf` matches Hermes' "recursive delete" pattern (docs/hermes-harness.md).
    rec.llm.enqueue(
        tool_call("terminal", {"command": "rm -rf doomed"}, call_id="call_rm_1"),
        text("Finished.", chunks=2),
    )
    async with rec.agent(RecordingClient(permission_answer=answer)) as agent:
        session = await agent.new_session()
        since = agent.client.mark()
        await agent.prompt(session, "Clean up the doomed directory")
        await agent.wait_kind("session_info_update", since=since, timeout=LATE_TIMEOUT)
        await agent.settle()


async def _permission_allow(rec: Recording) -> None:
    await _permission(rec, "allow_once")


async def _permission_deny(rec: Recording) -> None:
    await _permission(rec, "deny")


async def _cancel_tool(rec: Recording) -> None:
    # No model call follows the interrupted tool: the next scripted answer is the recovered turn's.
    rec.llm.enqueue(
        tool_call("terminal", {"command": BLOCKING_COMMAND}, call_id="call_block_1"),
        text("Recovered after reloading.", chunks=2),
    )
    try:
        async with rec.agent() as agent:
            session = await agent.new_session()
            since = agent.client.mark()
            turn = asyncio.ensure_future(agent.prompt(session, "Wait for the release file"))
            await agent.wait_kind("tool_call", since=since)
            await asyncio.sleep(0.3)  # the command is running
            await agent.conn.cancel(session_id=session)
            with contextlib.suppress(acp.RequestError):
                await turn  # Hermes 0.19: -32603 (the jam); the trace has it
            await agent.settle()
            # The jam: the next prompt in this process is "queued" and never runs.
            await agent.prompt(session, "Are you still there?")
            await agent.settle()
    finally:
        (rec.workspace / "release").touch()
    # Recovery: session/load in a fresh process, then the session answers again.
    async with rec.agent() as agent:
        await agent.load_session(session)
        since = agent.client.mark()
        await agent.prompt(session, "Try again")
        # The session's first answered turn: Hermes titles it now.
        await agent.wait_kind("session_info_update", since=since, timeout=LATE_TIMEOUT)
        await agent.settle()


async def _reload(rec: Recording) -> None:
    rec.llm.enqueue(
        text("First answer.", chunks=2),
        text("Second answer.", chunks=2),
        text("Third answer, after the reload.", chunks=2),
    )
    async with rec.agent() as agent:
        session = await agent.new_session()
        since = agent.client.mark()
        await agent.prompt(session, "First question")
        await agent.wait_kind("session_info_update", since=since, timeout=LATE_TIMEOUT)
        await agent.settle()
        await agent.prompt(session, "Second question")
        await agent.settle()
    # A fresh process (the runner's idle timeout, a restart): session/load, then a third turn.
    async with rec.agent() as agent:
        await agent.load_session(session)
        await agent.prompt(session, "Third question")
        await agent.settle()


SCENARIOS: dict[str, Scenario] = {
    scenario.name: scenario
    for scenario in (
        Scenario(
            "text",
            "One turn: a plain answer streamed in six chunks (no messageId), then the auto-title.",
            _text,
        ),
        Scenario(
            "thought",
            "One turn: reasoning_content in three chunks, then the answer in three chunks.",
            _thought,
        ),
        Scenario(
            "tool",
            "One turn: a `terminal` tool call (`echo …`) with its completing update, then text.",
            _tool,
        ),
        Scenario(
            "plan",
            "One turn: two `todo` tool calls (write three items, then merge progress); each"
            " result becomes a `plan` update; then text.",
            _plan,
        ),
        Scenario(
            "permission_allow",
            "`rm -rf doomed` with approvals manual: session/request_permission answered"
            " `allow_once`; the command runs; then text.",
            _permission_allow,
        ),
        Scenario(
            "permission_deny",
            "As permission_allow, answered `deny`: nothing runs, the model is told and answers.",
            _permission_deny,
        ),
        Scenario(
            "cancel_tool",
            "session/cancel while a blocking `terminal` command runs: the prompt fails with"
            ' -32603; the next prompt in that process only answers "Queued…" (the jam); then a'
            " fresh process, session/load (history replay) and a prompt that is answered.",
            _cancel_tool,
        ),
        Scenario(
            "reload",
            "Two turns in one process (PromptResponse.usage is a running total), then a fresh"
            " process: session/load replays the history, and a third turn (the total restarts).",
            _reload,
        ),
    )
}


async def record(name: str, command: Path | None = None) -> list[dict[str, Any]]:
    """Run one scenario against a fresh ScriptedLLM and temp homes; return its normalised trace."""
    scenario = SCENARIOS[name]
    executable = command or ensure_hermes_acp()
    with tempfile.TemporaryDirectory(prefix="hermes-rec-") as tmp, ScriptedLLM() as llm:
        root = Path(tmp).resolve()
        rec = Recording(root=root, llm=llm, command=executable)
        rec.workspace.mkdir()
        rec.normaliser.add(str(rec.workspace), "<cwd>")
        rec.normaliser.add(str(root), "<tmp>")
        rec.normaliser.add(f"127.0.0.1:{llm.port}", "127.0.0.1:<llm-port>")
        try:
            await scenario.run(rec)
        except BaseException:
            stderr = root / "hermes.stderr"
            if stderr.exists():
                sys.stderr.write(stderr.read_text(errors="replace")[-4000:])
            raise
        return rec.normalised()


def dump_trace(lines: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)


def load_trace(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "outdir", type=Path, help=f"where to write <scenario>.jsonl (the fixtures: {FIXTURES})"
    )
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO", help=f"default: all of {list(SCENARIOS)}")
    args = parser.parse_args(argv)
    unknown = [name for name in args.scenarios if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; known: {list(SCENARIOS)}")
    args.outdir.mkdir(parents=True, exist_ok=True)
    for name in args.scenarios or list(SCENARIOS):
        lines = asyncio.run(record(name))
        path = args.outdir / f"{name}.jsonl"
        path.write_text(dump_trace(lines))
        print(f"{path}: {len(lines)} messages", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
