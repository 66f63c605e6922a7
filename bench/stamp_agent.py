"""The demo agent, stamping each text chunk with the wall-clock time it is sent (bench/concurrency.py).

It is runs.demo_agent unchanged but for two things: a prompt `stream N` streams N short
chunks at the agent's chunk delay (HERMESWEB_DEMO_DELAY: 0.02 s = 50 tokens/s), and every
agent_message_chunk begins with `⟦<time.time()>⟧`, taken just before it is written to
stdout. The journal keeps that text, so the lag from agent to committed row can be read
back from the database afterwards, per token, however deltas were coalesced.

usage: python -m bench.stamp_agent [--home DIR] [--delay SECONDS]  (as runs.demo_agent)
"""

from __future__ import annotations

import re
import sys
import time

from runs.demo_agent import __main__ as demo_main
from runs.demo_agent import agent as demo_agent
from runs.demo_agent import turn as demo_turn

STAMP = re.compile(r"⟦(\d+\.\d+)⟧")
_STREAM = re.compile(r"\bstream (\d+)\b")
_say_chunk = demo_turn.Turn.say_chunk
_pick_script = demo_agent.pick_script


async def say_stamped(self: demo_turn.Turn, chunk: str, *, delay: float | None = None) -> None:
    await _say_chunk(self, f"⟦{time.time():.6f}⟧{chunk}", delay=delay)


def pick_script(text: str) -> tuple[str, demo_agent.TurnScript]:
    match = _STREAM.search(text)
    if match is None:
        return _pick_script(text)
    count = int(match.group(1))

    async def stream(turn: demo_turn.Turn) -> None:
        for index in range(count):
            await turn.say_chunk(f"token {index} ")

    return "stream", stream


demo_turn.Turn.say_chunk = say_stamped  # type: ignore[method-assign]
demo_agent.pick_script = pick_script  # type: ignore[assignment]

if __name__ == "__main__":
    sys.exit(demo_main.main())
