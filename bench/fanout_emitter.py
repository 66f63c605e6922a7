"""bench/fanout.py's emitter: appends to one run at a rate, as the runner does, in a process of its own.

It reads a round per line on stdin (a JSON list: the arguments below) and answers each with one
line of JSON on stdout, so that one Django start-up serves every round of a benchmark run.

Appends go as the runner's do — JournalWriter.flush: runs.journal.append_batch's transaction in a
database thread, then the publish from the event loop — so the commit and the publish-after-commit
are inside the measured path; `--mode naive` appends and then sends one channels_redis core-layer
group message per event, as bench/naive_asgi.py's consumers expect.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _support as S

DELTA = "the quick brown fox jumps "  # a few tokens, as a coalesced delta carries


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", type=int, required=True)
    parser.add_argument("--session", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--warmup", type=float, required=True)
    parser.add_argument("--mode", choices=("hermesweb", "naive"), required=True)
    return parser


async def serve() -> None:
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        result = await _emit(parser().parse_args(json.loads(line)))
        print(json.dumps(result), flush=True)


async def _emit(args: argparse.Namespace) -> dict[str, Any]:
    from asgiref.sync import async_to_sync, sync_to_async
    from django.db import transaction

    from runs import journal
    from runs.journal import NewEvent
    from runs.runner.writer import JournalWriter

    naive_send: Callable[[list[dict[str, Any]]], None] | None = None
    if args.mode == "naive":
        from bench.naive_asgi import naive_layer

        layer = naive_layer()
        group = f"session.{args.session}"

        async def send_each(envelopes: list[dict[str, Any]]) -> None:
            for envelope in envelopes:  # the naive design: one group message per event
                await layer.group_send(group, {"type": "bench.event", "event": envelope})

        naive_send = async_to_sync(send_each)

    def append_naive(events: list[NewEvent]) -> None:
        assert naive_send is not None
        with transaction.atomic():
            rows = journal.append_batch(args.run, events, publish=False)
            envelopes = [row.envelope(args.session) for row in rows]
            transaction.on_commit(lambda: naive_send(envelopes))

    if naive_send is not None:
        # As a naive runner would: its database thread publishes each event on commit.
        append_async: Callable[[list[NewEvent]], Awaitable[Any]] = sync_to_async(append_naive)
    else:
        # The runner's own path: JournalWriter.flush → append_batch's transaction in a database
        # thread, then the publish-after-commit (one notification, events inline) from this loop.
        append_async = JournalWriter(args.run).flush
    interval = args.batch / args.rate
    ticks = int((args.warmup + args.seconds) / interval)
    start = time.time() + 0.05
    measure_from = start + args.warmup
    measure_to = start + args.warmup + args.seconds
    durations: list[float] = []
    # Each measured event's emit time and its append's duration: a viewer's latency minus it is
    # what the server added after the publish (the emitter's commit tail is no server's).
    appends: list[tuple[float, float]] = []
    emitted = measured = 0
    for tick in range(ticks):
        delay = start + tick * interval - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        now = time.time()
        if now >= measure_to:
            break  # an emitter that fell behind its rate stops with the window, not after it
        inside = measure_from <= now
        events = [
            NewEvent("token.delta", {"message_id": "m1", "delta": DELTA, "t": now, "w": int(inside)})
            for _ in range(args.batch)
        ]
        await append_async(events)
        durations.append(time.time() - now)
        if inside:
            appends.append((now, durations[-1]))
        emitted += args.batch
        measured += args.batch if inside else 0
    end = time.time()
    await append_async([journal.done_event("completed")])
    return {
        "emitted": emitted,
        "measured": measured,
        "t0": measure_from,
        "t1": min(end, measure_to),
        "achieved_rate": emitted / (end - start),
        "append_p50_ms": 1000 * S.percentile(durations, 50),
        "append_p99_ms": 1000 * S.percentile(durations, 99),
        "appends": appends,
    }


if __name__ == "__main__":
    S.django_for_child()
    asyncio.run(serve())
