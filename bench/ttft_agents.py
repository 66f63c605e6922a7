"""Time to first token with the real npm agents, Codex and Claude: what hermesweb adds to each.

- hermesweb: `ttft.py`'s turns (a `submit` frame on a subscribed socket, through daphne, Redis
  and a runner) on a session of the built-in-style `codex` or `claude` entry, sandboxed, behind
  its network proxy, answered by the scripted model server (tests/support/scripted_llm.py: the
  Responses API for Codex, the Messages API for Claude; each turn streams "OK.");
- baseline (the agent's own time, same run): the same agent with the same per-user home and
  environment (runs/agent_homes.py), unsandboxed, driven with the ACP SDK in this process —
  session/prompt → first agent_message_chunk. For Codex the first chunk of every turn is its
  "Model metadata … not found" warning, on both paths.

Both skip the first turn (session/new, titles). Added = hermesweb - agent alone, p50 and p90.

usage: python bench/ttft_agents.py [--turns 10] [--quick] [--agents codex,claude] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _support as S
from bench import ttft

AGENTS = ("codex", "claude")


async def agent_alone(name: str, entry: dict[str, Any], turns: int, state: Path, cwd: Path) -> list[float]:
    """The agent with the environment the runner gives it, without hermesweb in between."""
    import acp
    from acp.schema import ClientCapabilities, Implementation

    from runs.agent_homes import prepare_home
    from runs.agents import AgentSpec
    from runs.runner.sandbox import agent_env

    spec = AgentSpec(name=name, command=entry["command"], env=entry["env"])
    state.mkdir(parents=True, exist_ok=True)
    prepare_home(spec.command, spec.env, state)
    client = ttft.FirstChunkClient()
    with open(state / "agent-stderr.log", "ab") as stderr:
        async with acp.spawn_agent_process(
            client,
            spec.command,
            env=agent_env(spec, state, sandboxed=False),
            cwd=str(cwd),
            transport_kwargs={"stderr": stderr, "limit": 16 * 1024 * 1024},
            use_unstable_protocol=True,
        ) as (conn, _process):
            await conn.initialize(
                protocol_version=acp.PROTOCOL_VERSION,
                client_capabilities=ClientCapabilities(),
                client_info=Implementation(name="hermesweb-bench", version="0"),
            )
            session = await conn.new_session(cwd=str(cwd), mcp_servers=[])
            times = []
            for turn in range(turns + 1):
                await asyncio.sleep(ttft.PAUSE_SECONDS)
                client.first = asyncio.get_running_loop().create_future()
                start = time.perf_counter()
                prompt = asyncio.ensure_future(
                    conn.prompt(session_id=session.session_id, prompt=[acp.text_block(ttft.PROMPT)])
                )
                first = await asyncio.wait_for(client.first, 120)
                await prompt
                if turn:
                    times.append(first - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", type=int, help="measured turns each way (10; 3 with --quick)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--agents", default=",".join(AGENTS))
    parser.add_argument("--json", help="append result rows to this file (bench/run)")
    args = parser.parse_args()
    turns = args.turns or (3 if args.quick else 10)
    names = [name for name in args.agents.split(",") if name]
    from tests.support.npm_agents import agents_bin, entry_for
    from tests.support.scripted_llm import ScriptedLLM

    bin_dir = agents_bin()
    llm = ScriptedLLM().start()
    operator = Path(tempfile.mkdtemp(prefix="hermesweb-bench-operator-"))
    entries = {name: entry_for(name, operator / name, llm, bin_dir) for name in names}
    bench = S.setup("postgres", redis=True, name="ttft-agents", HERMESWEB_AGENTS=json.dumps(entries))
    from hermesweb.models import ApiToken

    owner = S.make_owner()
    cookie = S.session_cookie(owner)
    _, token = ApiToken.issue(owner, name="bench")
    log_dir = bench.data_dir / "logs"
    log_dir.mkdir(exist_ok=True)
    rows = []
    daphne, port = S.start_daphne("hermesweb.asgi:application", bench.env, log_dir)
    runner = S.start_runner(bench.env, log_dir, runner_id="bench-ttft-agents")
    try:
        for name in names:
            session = S.make_session(owner, agent=name, project_name=f"ttft-{name}")
            S.log(f"ttft-agents: {turns} turns of {name} through hermesweb")
            through = asyncio.run(
                ttft.through_hermesweb(turns, port, cookie, token, session.pk, ("socket",))
            )["socket"]["first_token"]
            S.log(f"ttft-agents: {turns} turns of {name} alone")
            alone = asyncio.run(
                agent_alone(
                    name, entries[name], turns, bench.data_dir / "alone" / name, Path(session.project.path)
                )
            )
            rows += agent_rows(name, through, alone)
    finally:
        runner.stop()
        daphne.stop()
        llm.stop()
    S.emit(rows, args.json)


def agent_rows(name: str, through: list[float], alone: list[float]) -> list[Any]:
    def ms(values: list[float], q: float) -> float:
        return 1000 * S.percentile(values, q)

    rows = []
    for q in (50, 90):
        total, own = ms(through, q), ms(alone, q)
        rows.append(
            S.Row(
                bench="ttft-agents",
                figure=f"p{q} submit → first token.delta at the viewer, {name} (sandboxed, proxied)",
                value=total,
                unit="ms",
                higher_is_better=False,
                ceiling=f"{name} alone",
                ceiling_value=own,
            )
        )
        rows.append(
            S.Row(
                bench="ttft-agents",
                figure=f"p{q} added by hermesweb to {name}'s first token (the above minus {name} alone)",
                value=total - own,
                unit="ms",
                higher_is_better=False,
            )
        )
    return rows


if __name__ == "__main__":
    main()
