"""Journal ingest: events/s one writer sustains into PostgreSQL and SQLite.

Measured, each on a fresh run, in one process per database:
- writer, token deltas: runs.runner.writer.JournalWriter fed 4-character token deltas as
  fast as an agent's reader can hand them over (the coalescing window merges them).
- writer, mixed: the same with a tool.updated after every 9 deltas, which cannot be
  merged and forces a flush, so rows are written at the rate they arrive.
- batch append x100: 100 distinct events per transaction through JournalWriter.flush(extra),
  the runner's own batch path (append_batch in asgiref's database thread, then the
  publish-after-commit from the event loop).
- baseline: one INSERT per event (JournalEvent.objects.create in a loop, autocommit).
  Also journal.append_batch() of one event each, the single-event API with all its invariants.
- ceiling: the same rows as one raw multi-row INSERT per 1,000 (cursor.executemany;
  COPY on PostgreSQL): what the database takes with no Python per row.

usage: python bench/ingest.py [--db sqlite|postgres|both] [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import string
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _support as S

# Issue #25: events/s a runner's writer sustains, as a multiple of the raw driver's bulk insert of
# distinct rows (COPY / executemany, 1,000 a transaction) in the same process and run.
OF_RAW_BULK = 0.5


def _vocabulary(size: int = 3000) -> list[str]:
    # Deterministic pseudo-words: deltas must not all be one string, which caches would flatter.
    rng = random.Random(8)
    return ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) + " " for _ in range(size)]


WORDS = _vocabulary()


def token(i: int) -> str:
    return WORDS[(i * 7919) % len(WORDS)]


def tool_payload(i: int) -> dict[str, Any]:
    return {
        "tool_call_id": f"call-{i // 50:08d}",
        "status": "in_progress",
        "content": [
            {
                "type": "content",
                "content": {"type": "text", "text": f"collected {i} items; {i // 3} passed so far"},
            }
        ],
    }


def fresh_run() -> int:
    owner = S.make_owner()
    return int(S.running_run(S.make_session(owner, project_name="ingest")).pk)


def timed(fn: Callable[[], int]) -> tuple[float, int]:
    start = time.perf_counter()
    events = fn()
    return events / (time.perf_counter() - start), events


# ---------------------------------------------------------------- the cases


def per_event_create(n: int) -> int:
    from django.utils import timezone

    from runs.models import JournalEvent

    run_id = fresh_run()
    for seq in range(1, n + 1):
        JournalEvent.objects.create(
            run_id=run_id, seq=seq, type="tool.updated", created_at=timezone.now(), payload=tool_payload(seq)
        )
    return n


def per_event_append(n: int) -> int:
    from asgiref.sync import sync_to_async

    from runs import journal

    run_id = fresh_run()
    append = sync_to_async(journal.append_batch)

    async def go() -> None:
        for seq in range(1, n + 1):
            await append(run_id, [journal.NewEvent("tool.updated", tool_payload(seq))])

    asyncio.run(go())
    return n


def batch_append(n: int, batch: int = 100) -> int:
    """Batches as the runner writes them: JournalWriter.flush(extra) — append_batch in asgiref's
    database thread, then the publish from the event loop."""
    from runs.journal import NewEvent
    from runs.runner.writer import JournalWriter

    run_id = fresh_run()

    async def go() -> None:
        writer = JournalWriter(run_id)
        for start in range(0, n, batch):
            events = [NewEvent("tool.updated", tool_payload(i)) for i in range(start, start + batch)]
            await writer.flush(events)

    asyncio.run(go())
    return n


def raw_insert(n: int, chunk: int = 1000) -> int:
    """The ceiling: rows built in Python once, handed to the driver in bulk."""
    import orjson
    from django.db import connection, transaction
    from django.utils import timezone

    run_id = fresh_run()
    table = "runs_journalevent"
    columns = "run_id, seq, type, created_at, terminal, payload"
    for start in range(0, n, chunk):
        now = timezone.now()
        rows = [
            (run_id, seq, "tool.updated", now, False, orjson.dumps(tool_payload(seq)).decode())
            for seq in range(start + 1, start + chunk + 1)
        ]
        with transaction.atomic(), connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                raw = cursor.cursor  # psycopg's own cursor, for COPY
                with raw.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
            else:
                cursor.executemany(f"INSERT INTO {table} ({columns}) VALUES (%s, %s, %s, %s, %s, %s)", rows)
    return n


def writer_feed(n: int, tool_every: int = 0) -> tuple[int, int]:
    """Feed a JournalWriter n events as a fast agent's reader would; returns (events, rows)."""
    from runs.journal import NewEvent
    from runs.models import JournalEvent
    from runs.runner.writer import JournalWriter, group_commit

    run_id = fresh_run()

    async def feed() -> None:
        group = group_commit()
        group.write_from_loop()  # as a runner does
        writer = JournalWriter(run_id)
        for i in range(n):
            if tool_every and i % tool_every == tool_every - 1:
                writer.add([NewEvent("tool.updated", tool_payload(i))])
            else:
                writer.add([NewEvent("token.delta", {"message_id": "msg-0001", "delta": token(i)})])
            if i % 16 == 15:
                # A reader yields between stdout reads; ACP messages arrive a few per read.
                await asyncio.sleep(0)
        # The lock is FIFO: this flush runs after every flush queued before it.
        await writer.flush()
        await group.close()

    asyncio.run(feed())
    rows = JournalEvent.objects.filter(run_id=run_id).count()
    text = "".join(
        e.payload["delta"]
        for e in JournalEvent.objects.filter(run_id=run_id, type="token.delta").order_by("seq")
    )
    expected = "".join(token(i) for i in range(n) if not (tool_every and i % tool_every == tool_every - 1))
    if text != expected:
        raise AssertionError("the coalesced journal lost or reordered deltas")
    return n, rows


# ---------------------------------------------------------------- one database


def measure(db: str, quick: bool) -> list[S.Row]:
    # As deployed: PostgreSQL with the Redis doorbell, SQLite embedded (no Redis).
    S.setup(db, redis=db == "postgres", name=f"ingest-{db}")
    scale = 0.2 if quick else 1.0
    n_slow = int(3000 * scale)
    n_fast = int(50_000 * scale)
    n_writer = int(200_000 * scale)
    results: dict[str, float] = {}
    notes: dict[str, str] = {}
    S.log(f"ingest {db}: one INSERT per event x{n_slow}")
    results["create"], _ = timed(lambda: per_event_create(n_slow))
    S.log(f"ingest {db}: append() per event x{n_slow}")
    results["append1"], _ = timed(lambda: per_event_append(n_slow))
    S.log(f"ingest {db}: append_batch x100, {n_fast} events")
    results["batch"], _ = timed(lambda: batch_append(n_fast))
    S.log(f"ingest {db}: raw bulk insert, {n_fast} rows")
    results["raw"], _ = timed(lambda: raw_insert(n_fast))
    for key, every in (("writer", 0), ("mixed", 10)):
        S.log(f"ingest {db}: JournalWriter, {n_writer} events, tool event every {every or '—'}")
        start = time.perf_counter()
        events, rows = writer_feed(n_writer, every)
        results[key] = events / (time.perf_counter() - start)
        notes[key] = f"{events} events → {rows} rows"
    label = "PostgreSQL" if db == "postgres" else "SQLite"

    def row(figure: str, key: str, ceiling: bool = False) -> S.Row:
        return S.Row(
            bench="ingest",
            figure=f"{label}: {figure}",
            value=results[key],
            unit="ev/s",
            higher_is_better=True,
            baseline="INSERT per event",
            baseline_value=results["create"],
            ceiling="raw bulk INSERT" if ceiling else "",
            ceiling_value=results["raw"] if ceiling else math.nan,
            note=notes.get(key, "") or OTHER_PATHS.get(key, ""),
        )

    # The ingest target is for what a runner sustains, i.e. through JournalWriter.
    targets = [
        S.ratio_row(
            "ingest",
            f"{label}: JournalWriter, {figure} ÷ raw bulk INSERT",
            results[key],
            results["raw"],
            unit="ev/s",
            limit=OF_RAW_BULK,
            at_most=False,
        )
        for key, figure in (("writer", "token deltas"), ("mixed", "deltas + tool events"))
    ]
    return [
        row("JournalWriter, token deltas (coalesced)", "writer"),
        row("JournalWriter, deltas + 1 tool event in 10", "mixed"),
        row("batch append, 100 events per transaction", "batch", ceiling=True),
        row("append_batch() per event", "append1"),
        *targets,
    ]


# Figures for the journal's other write APIs: no runner writes through them, so no target.
OTHER_PATHS = {
    "batch": "append_batch with 100 distinct events (not coalescible): ~4 round trips a batch; "
    "the runner's path is the JournalWriter rows",
    "append1": "the single-event API (lock, insert, update, publish each time); the runner never writes so",
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", help="append result rows to this file (bench/run)")
    args = parser.parse_args()
    if args.db == "both":
        # Django's database settings are per process: one child per database.
        for db in ("postgres", "sqlite"):
            cmd = [sys.executable, __file__, "--db", db, *(["--quick"] if args.quick else [])]
            subprocess.run([*cmd, *(["--json", args.json] if args.json else [])], check=True)
        return
    S.emit(measure(args.db, args.quick), args.json)


if __name__ == "__main__":
    main()
