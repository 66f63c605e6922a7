"""Record real Codex and Claude ACP traffic as JSON-lines fixtures, as record_hermes does for Hermes.

    python -m tests.support.record_npm_agents [OUTDIR] [AGENT_SCENARIO ...]   # codex_text, claude_tool …

Each scenario starts a ScriptedLLM (the Responses API for Codex, the Messages API for Claude),
gives the agent a fresh per-user home seeded the way the runner seeds it (runs/agent_homes.py:
the environment `agent_env` builds, unsandboxed), drives it with the runner's `initialize`, and
writes every JSON-RPC message both ways to `OUTDIR/<agent>_<scenario>.jsonl`, normalised by
record_hermes' Normaliser (session ids, temp paths, the model server's port, timestamps) plus
the agents' own volatile ids. tests/test_codex_traces.py replays them through the translator
against golden events and transcripts. Re-record after an upgrade of agents/package-lock.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import django
from django.conf import settings

if not settings.configured:  # run as `python -m …`: the runner's modules below need Django's apps
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hermesweb.settings")
    django.setup()

import acp
from acp import text_block
from acp.connection import StreamDirection, StreamEvent
from acp.schema import (
    ClientCapabilities,
    ElicitationCapabilities,
    ElicitationFormCapabilities,
    Implementation,
)

from runs.agent_homes import prepare_home
from runs.agents import AgentSpec
from runs.runner.client_methods import FS_CAPABILITIES
from runs.runner.sandbox import agent_env
from tests.support.acp_client import RecordingClient
from tests.support.npm_agents import agents_bin, entry_for, shell_call
from tests.support.record_hermes import Normaliser
from tests.support.scripted_llm import ScriptedLLM, reasoning, text, tool_call

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "npm_agents"
STEP_TIMEOUT = 120.0
AGENTS = ("codex", "claude")
# Values that change on every recording besides what Normaliser knows: Codex's thread, turn and
# review ids (UUIDv7), Claude's tool ids, epoch milliseconds, costs and the CLI's timings.
_VOLATILE = [
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<uuid>"),
    (re.compile(r"\btoolu_[0-9]+\b"), "toolu_<n>"),
    (re.compile(r"\bChunk ID: [0-9a-f]+\b"), "Chunk ID: <id>"),
    (re.compile(r"\bWall time: [0-9.]+ seconds\b"), "Wall time: <s> seconds"),
]
_VOLATILE_KEYS = {"startedAtMs", "completedAtMs", "updatedAt", "durationMs", "amount"}


def stable(value: Any) -> Any:
    if isinstance(value, str):
        for pattern, placeholder in _VOLATILE:
            value = pattern.sub(placeholder, value)
        return value
    if isinstance(value, list):
        return [stable(item) for item in value]
    if isinstance(value, dict):
        return {key: f"<{key}>" if key in _VOLATILE_KEYS else stable(item) for key, item in value.items()}
    return value


@dataclass
class Session:
    conn: Any
    client: RecordingClient
    session_id: str
    cwd: Path
    llm: ScriptedLLM
    agent: str

    async def prompt(self, message: str) -> Any:
        async with asyncio.timeout(STEP_TIMEOUT):
            return await self.conn.prompt(session_id=self.session_id, prompt=[text_block(message)])

    async def settle(self, quiet: float = 1.0) -> None:
        """Until the agent has been silent for `quiet` seconds (late usage and title updates)."""
        while True:
            count = len(self.client.updates)
            await asyncio.sleep(quiet)
            if len(self.client.updates) == count:
                return


async def _text(s: Session) -> None:
    s.llm.enqueue(reasoning("Weighing the greeting.", "Hello from the scripted model.", chunks=3))
    await s.prompt("Say hello")


async def _tool(s: Session) -> None:
    name, arguments = shell_call(s.agent, "echo TOOL-OUT")
    s.llm.enqueue(tool_call(name, arguments, call_id="call_tool_1"), text("The command ran."))
    await s.prompt("Run the command")


async def _permission(s: Session) -> None:
    (s.cwd / "doomed").mkdir()
    name, arguments = shell_call(s.agent, "rm -rf doomed", escalate=True)
    s.client.permission_answer = "accept_execpolicy_amendment" if s.agent == "codex" else "allow-once"
    s.llm.enqueue(tool_call(name, arguments, call_id="call_perm_1"), text("Done with the command."))
    await s.prompt("Clean up the doomed directory")


async def _cancel(s: Session) -> None:
    gate = threading.Event()
    s.llm.enqueue(text("word " * 20, chunks=20, gate=gate), text("After the cancel."))
    since = s.client.mark()
    turn = asyncio.ensure_future(s.prompt("Talk for a while"))
    await s.client.wait_for(
        lambda u: u.session_update == "agent_message_chunk" and "word" in getattr(u.content, "text", ""),
        since=since,
        timeout=STEP_TIMEOUT,
    )
    await s.conn.cancel(session_id=s.session_id)
    await turn
    gate.set()
    await s.settle()
    await s.prompt("Are you still there?")


SCENARIOS: dict[str, Callable[[Session], Awaitable[None]]] = {
    "text": _text,
    "tool": _tool,
    "permission": _permission,
    "cancel": _cancel,
}


async def record(agent: str, scenario: str) -> list[dict[str, Any]]:
    bin_dir = agents_bin()
    lines: list[dict[str, Any]] = []
    normaliser = Normaliser()

    def observe(event: StreamEvent) -> None:
        sender = "client" if event.direction is StreamDirection.OUTGOING else "agent"
        lines.append({"from": sender, **{k: v for k, v in event.message.items() if k != "jsonrpc"}})

    with tempfile.TemporaryDirectory(prefix=f"{agent}-rec-", dir="/var/tmp") as tmp, ScriptedLLM() as llm:
        root = Path(tmp).resolve()
        cwd, state = root / "workspace", root / "state"
        cwd.mkdir()
        state.mkdir()
        entry = entry_for(agent, root / "operator", llm, bin_dir)
        spec = AgentSpec(name=agent, command=entry["command"], env=entry["env"])
        prepare_home(spec.command, spec.env, state)
        for literal, placeholder in ((cwd, "<cwd>"), (state, "<home>"), (root, "<tmp>")):
            normaliser.add(str(literal), placeholder)
        normaliser.add(f"127.0.0.1:{llm.port}", "127.0.0.1:<llm-port>")
        client = RecordingClient()
        with (root / "agent.stderr").open("ab") as stderr:
            async with acp.spawn_agent_process(
                client,
                spec.command,
                env=agent_env(spec, state, sandboxed=False),
                cwd=str(cwd),
                observers=[observe],
                transport_kwargs={"stderr": stderr, "limit": 16 * 1024 * 1024},
                use_unstable_protocol=True,
            ) as (conn, _process):
                async with asyncio.timeout(STEP_TIMEOUT):
                    # The runner's initialize (runs/runner/agents.py), so the trace is what it sees.
                    await conn.initialize(
                        protocol_version=acp.PROTOCOL_VERSION,
                        client_capabilities=ClientCapabilities(
                            elicitation=ElicitationCapabilities(form=ElicitationFormCapabilities()),
                            fs=FS_CAPABILITIES,
                            terminal=True,
                        ),
                        client_info=Implementation(name="hermesweb", version="0.1.0"),
                    )
                    opened = await conn.new_session(cwd=str(cwd), mcp_servers=[])
                normaliser.add_session(opened.session_id)
                session = Session(conn, client, opened.session_id, cwd, llm, agent)
                await session.settle()
                await SCENARIOS[scenario](session)
                await session.settle()
        return [stable(normaliser(line)) for line in lines]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("outdir", type=Path, nargs="?", default=FIXTURES)
    parser.add_argument("names", nargs="*", metavar="AGENT_SCENARIO")
    args = parser.parse_args(argv)
    names = args.names or [f"{agent}_{scenario}" for agent in AGENTS for scenario in SCENARIOS]
    args.outdir.mkdir(parents=True, exist_ok=True)
    for name in names:
        agent, scenario = name.split("_", 1)
        trace = asyncio.run(record(agent, scenario))
        (args.outdir / f"{name}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in trace))
        print(f"{name}: {len(trace)} messages", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
