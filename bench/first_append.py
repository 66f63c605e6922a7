"""A turn's first-token append on PostgreSQL, from the runner's loop against a database thread.

The journal writer's group commit (runs/runner/writer.py) is on every first token's path: the
token is committed before it is published. In a runner on PostgreSQL the group statement
goes from the runner's event loop on a connection of its own (`LoopConnection`); the
baseline is how it went before, and still goes elsewhere: through one of the writer's
database threads on Django's connection (`writer.write_group`), a hop there and one back. Both
are measured in this one process, alternately, after the idle pause a turn starts with
(`--pause`, 0.3 s like bench/ttft.py's turns: the first statement after one is cold).

Timed: the append alone, and the flush the writer does (append, then the publish to Redis)
— what the first token waits for between the agent's chunk and the web's notification. The
ceiling is the same row as one plain `INSERT` on a loop connection (the floor's statement,
bench/ttft_floor.py). Run alone: `python bench/first_append.py [--samples N] [--pause S]`.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _support as S

# The journal's shape (its unique (run, seq) index included), for the ceiling's plain INSERT.
RAW_TABLE = (
    "CREATE TABLE IF NOT EXISTS first_append_raw (id bigserial PRIMARY KEY, run_id bigint NOT NULL,"
    " seq integer NOT NULL, type text NOT NULL, created_at timestamptz NOT NULL,"
    " terminal boolean NOT NULL, payload jsonb NOT NULL, UNIQUE (run_id, seq))"
)
RAW_INSERT = (
    "INSERT INTO first_append_raw (run_id, seq, type, created_at, terminal, payload)"
    " VALUES (%s, %s, 'token.delta', now(), false, %s::jsonb)"
)


async def measure(samples: int, pause: float) -> dict[str, list[float]]:
    from asgiref.sync import sync_to_async

    from bench.ingest import fresh_run
    from runs.journal import NewEvent
    from runs.runner.connections import LoopConnection
    from runs.runner.writer import JournalWriter, group_commit

    run_id = await sync_to_async(fresh_run)()
    writer = JournalWriter(run_id, window_ms=0)
    group = group_commit()
    loop_connection = LoopConnection()
    raw = await LoopConnection().get()
    await raw.execute(RAW_TABLE)
    times: dict[str, list[float]] = {}
    warmup = 6  # psycopg prepares a statement from its fifth run on a connection
    ways = ("loop", "thread", "raw")
    try:
        for i in range((samples + warmup) * len(ways)):
            way = ways[i % len(ways)]
            group.connection = loop_connection if way == "loop" else None
            await asyncio.sleep(pause)
            token = NewEvent("token.delta", {"message_id": f"m{i}", "delta": "Hello"})
            start = time.perf_counter()
            if way == "raw":
                await raw.execute(RAW_INSERT, [run_id, i, '{"message_id": "m", "delta": "Hello"}'])
                appended = time.perf_counter()
            else:
                written = await group.write(run_id, [token])
                appended = time.perf_counter()
                assert written.to_publish is False  # the group published it before answering
            if i >= warmup * len(ways):
                times.setdefault(f"{way} append", []).append((appended - start) * 1000)
            if way != "raw":  # and the flush as the writer does it, the same way, cold again
                await asyncio.sleep(pause)
                start = time.perf_counter()
                await writer.flush([NewEvent("token.delta", {"message_id": f"f{i}", "delta": "Hello"})])
                if i >= warmup * len(ways):
                    times.setdefault(f"{way} flush", []).append((time.perf_counter() - start) * 1000)
    finally:
        await loop_connection.discard()
        await raw.close()
    return times


def rows(times: dict[str, list[float]], pause: float) -> list[S.Row]:
    out: list[S.Row] = []
    for q in (50, 90):
        for what, figure in (("append", "one-row group append"), ("flush", "writer flush: append + publish")):
            note = f"{len(times[f'loop {what}'])} samples each way, alternately, {pause:g} s idle before each"
            out.append(
                S.Row(
                    bench="first_append",
                    figure=f"p{q} {figure}, from the runner's loop (PostgreSQL)",
                    value=S.percentile(times[f"loop {what}"], q),
                    unit="ms",
                    higher_is_better=False,
                    baseline="database thread",
                    baseline_value=S.percentile(times[f"thread {what}"], q),
                    ceiling="raw INSERT, loop conn" if what == "append" else "",
                    ceiling_value=S.percentile(times["raw append"], q) if what == "append" else math.nan,
                    note=note,
                )
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, help="measured appends each way (60; 15 with --quick)")
    parser.add_argument("--pause", type=float, default=0.3, help="idle seconds before each (0.3)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", help="append result rows to this file (bench/run)")
    args = parser.parse_args()
    samples = args.samples or (15 if args.quick else 60)
    S.setup("postgres", redis=True, name="first-append")
    S.log(f"first_append: {samples} samples each way, {args.pause:g} s apart")
    times: dict[str, Any] = asyncio.run(measure(samples, args.pause))
    S.emit(rows(times, args.pause), args.json)


if __name__ == "__main__":
    main()
