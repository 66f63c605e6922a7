"""The demo agent, stamping each text chunk with the wall-clock time it is sent (bench/concurrency.py).

It is runs.demo_agent unchanged but for three things: a prompt `stream N` streams N short
chunks at the agent's chunk delay (HERMESWEB_DEMO_DELAY: 0.02 s = 50 tokens/s); every
agent_message_chunk begins with `⟦<time.time()>⟧`, taken just before it is written to
stdout; and the chunks of `stream` turns are written by one ticker per process (`Ticker`).
The journal keeps the stamps, so the lag from agent to committed row can be read back from
the database afterwards, per token, however deltas were coalesced.

usage: python -m bench.stamp_agent [--home DIR] [--delay SECONDS]  (as runs.demo_agent)
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from dataclasses import dataclass, field

import orjson

from runs.demo_agent import __main__ as demo_main
from runs.demo_agent import agent as demo_agent
from runs.demo_agent import turn as demo_turn

STAMP = re.compile(r"⟦(\d+\.\d+)⟧")
_STREAM = re.compile(r"\bstream (\d+)\b")
_say_chunk = demo_turn.Turn.say_chunk
_pick_script = demo_agent.pick_script


async def say_stamped(self: demo_turn.Turn, chunk: str, *, delay: float | None = None) -> None:
    await _say_chunk(self, f"⟦{time.time():.6f}⟧{chunk}", delay=delay)


@dataclass
class Stream:
    turn: demo_turn.Turn
    count: int
    done: asyncio.Future[None]
    sent: int = 0
    message_id: str = field(default="")


class Ticker:
    """Every `stream` turn of this process, one chunk each per tick, in one write.

    The agents are the load generator and share two cores with what they load. Driven
    through the SDK, one timer and one task per session, a chunk cost them ~350 µs of CPU:
    a whole core at 100 runs, which the runner and the web then lacked. The same JSON-RPC
    notifications, built as plain dicts and written together on the SDK's own stdout
    writer once per tick, cost a few µs each. Nothing else is in flight while a `stream`
    turn streams, so no other message of its session is overtaken.
    """

    def __init__(self) -> None:
        self.streams: list[Stream] = []
        self._task: asyncio.Task[None] | None = None

    async def stream(self, turn: demo_turn.Turn, count: int) -> None:
        loop = asyncio.get_running_loop()
        entry = Stream(turn, count, loop.create_future(), message_id=turn._message_id("text"))
        self.streams.append(entry)
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(turn))
        await entry.done

    async def _run(self, any_turn: demo_turn.Turn) -> None:
        # The connection → transport → the stdout StreamWriter: the demo agent's own transport
        # (runs/demo_agent/transport.py) holds it, the SDK's held it in its sender (acp 0.x internals).
        transport = any_turn.conn._conn._transport  # type: ignore[attr-defined]
        stdout: asyncio.StreamWriter = getattr(transport, "_writer", None) or transport._sender._writer
        loop = asyncio.get_running_loop()
        delay = float(os.environ.get("HERMESWEB_DEMO_DELAY", "0.02"))
        tick = loop.time()
        while self.streams:
            lines = []
            for entry in list(self.streams):
                turn = entry.turn
                if turn.cancelled:
                    self._end(entry, demo_turn.TurnCancelled())
                    continue
                chunk = f"token {entry.sent} "
                turn.output_words += 2
                update = {
                    "sessionUpdate": "agent_message_chunk",
                    "content": {"type": "text", "text": f"⟦{time.time():.6f}⟧{chunk}"},
                    "messageId": entry.message_id,
                }
                params = {"sessionId": turn.session_id, "update": update}
                lines.append(orjson.dumps({"jsonrpc": "2.0", "method": "session/update", "params": params}))
                turn.record(update)
                entry.sent += 1
                if entry.sent == entry.count:
                    self._end(entry, None)
            if lines:
                stdout.write(b"\n".join(lines) + b"\n")
            tick += delay
            await asyncio.sleep(max(0.0, tick - loop.time()))

    def _end(self, entry: Stream, error: BaseException | None) -> None:
        self.streams.remove(entry)
        if entry.done.done():
            return
        if error is None:
            entry.done.set_result(None)
        else:
            entry.done.set_exception(error)


ticker = Ticker()


def pick_script(text: str) -> tuple[str, demo_agent.TurnScript]:
    match = _STREAM.search(text)
    if match is None:
        return _pick_script(text)
    count = int(match.group(1))

    async def stream(turn: demo_turn.Turn) -> None:
        await ticker.stream(turn, count)

    return "stream", stream


demo_turn.Turn.say_chunk = say_stamped  # type: ignore[method-assign]
demo_agent.pick_script = pick_script  # type: ignore[assignment]

if __name__ == "__main__":
    sys.exit(demo_main.main())
