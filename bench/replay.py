"""Replay catch-up: a client receiving a finished 100k-event run from seq 0.

- WebSocket: /ws/sessions/{id}/ with `{"type": "subscribe", "after": {"<run>": 0}}`, timed
  from the subscribe to the terminal event's frame (daphne + hermesweb.asgi).
- Polling: `GET /api/runs/{id}/events?after_seq=…&limit=…` page after page over one
  keep-alive connection until `terminal` and no `has_more` (pages are capped by
  HERMESWEB_EVENTS_PAGE_MAX, 5000 by default). Two clients: one that follows each page's
  `Link: rel="next"` (asking for the next page before it parses this one; the target's), and
  one that reads the next cursor from the parsed page.
- Baseline: raw range reads of the same table in this process, pages of the same size:
  the ORM's values_list, and (as the ceiling) raw SQL on the driver's cursor. Neither
  encodes, authenticates or crosses a socket, so they bound what any client can get.

Each figure is the median of --passes passes (after a warm-up), each pass the raw SQL pages,
then the WebSocket replay, then the two polling replays; the web's and this client's CPU per event
are given beside them.

usage: python bench/replay.py [--db postgres|sqlite] [--events 100000] [--quick] [--json FILE]
                              [--passes 3] [--profile DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import http.client
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _support as S

# Issue #25: a client's catch-up gets at least half of what raw SQL range reads of the same
# table give in this process, on the same run (the old absolute target was 100k events/s).
OF_RAW_SQL = 0.5
TEXT = "Reading the failing test first: the fixture builds the session before the project "


def build_run(events: int) -> tuple[Any, int, int]:
    """A finished run of `events` events (deltas, a tool update every 20th), written through the journal."""
    from runs import journal
    from runs.journal import NewEvent

    owner = S.make_owner()
    session = S.make_session(owner, project_name="replay")
    run = S.running_run(session)
    chunk = 1000
    for start in range(0, events - 1, chunk):
        batch = []
        for i in range(start, min(start + chunk, events - 1)):
            if i % 20 == 19:
                batch.append(
                    NewEvent("tool.updated", {"tool_call_id": f"call-{i // 100}", "status": "in_progress"})
                )
            else:
                batch.append(NewEvent("token.delta", {"message_id": f"msg-{i // 500}", "delta": TEXT}))
        journal.append_batch(run.pk, batch, publish=False)
    journal.append_batch(run.pk, [journal.done_event("completed")], publish=False)
    return owner, int(session.pk), int(run.pk)


def read_orm(run_id: int, page: int) -> int:
    from runs.models import JournalEvent

    after, count = 0, 0
    while True:
        rows = list(
            JournalEvent.objects.filter(run_id=run_id, seq__gt=after)
            .order_by("seq")
            .values_list("seq", "type", "created_at", "terminal", "payload")[:page]
        )
        if not rows:
            return count
        count += len(rows)
        after = rows[-1][0]


def read_raw(run_id: int, page: int) -> int:
    from django.db import connection

    sql = (
        "SELECT seq, type, created_at, terminal, payload FROM runs_journalevent "
        "WHERE run_id = %s AND seq > %s ORDER BY seq LIMIT %s"
    )
    after, count = 0, 0
    with connection.cursor() as cursor:
        while True:
            cursor.execute(sql, [run_id, after, page])
            rows = cursor.fetchall()
            if not rows:
                return count
            count += len(rows)
            after = rows[-1][0]


async def replay_websocket(port: int, cookie: str, session_id: int, run_id: int) -> tuple[float, int]:
    import orjson

    from bench import _ws

    state = {"events": 0, "last": 0, "done": False, "ordered": True, "frames": 0}
    finished = asyncio.get_running_loop().create_future()

    def on_frame(payload: bytes, now: float) -> None:
        message = orjson.loads(payload)
        events = _ws.envelopes(message)
        state["frames"] += bool(events)
        for event in events:
            state["ordered"] &= event["seq"] == state["last"] + 1
            state["last"] = event["seq"]
            state["events"] += 1
            if event["terminal"] and not finished.done():
                finished.set_result(now)

    client = await _ws.connect(
        port, f"/ws/sessions/{session_id}/", on_frame, cookie=cookie, origin=f"http://127.0.0.1:{port}"
    )
    start = time.time()
    client.send_json({"type": "subscribe", "after": {str(run_id): 0}})
    end = await asyncio.wait_for(finished, 300)
    client.close()
    if not state["ordered"]:
        raise AssertionError("the WebSocket replay skipped or repeated a seq")
    return end - start, int(state["events"])


def replay_polling(
    port: int, cookie: str, run_id: int, page: int, *, follow_next: bool = False
) -> tuple[float, int]:
    """Page after page over one keep-alive connection, each page's events parsed.

    `follow_next`: the next request is sent as soon as a page's bytes are in, from its
    `Link: rel="next"` header, and the page is parsed while the web builds the next one; else
    the next cursor is read from the parsed page, so client and web take turns.
    """
    import orjson

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Cookie": f"sessionid={cookie}"}
    after, count = 0, 0
    start = time.perf_counter()
    conn.request("GET", f"/api/runs/{run_id}/events?after_seq=0&limit={page}", headers=headers)
    while True:
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"polling API answered {response.status}: {body[:300]!r}")
        link = response.getheader("Link") if follow_next else None
        if link:
            conn.request("GET", link.removeprefix("<").split(">;")[0], headers=headers)
        data = orjson.loads(body)
        events = data["events"]
        if events:
            if events[0]["seq"] != after + 1:
                raise AssertionError("the polling replay skipped or repeated a seq")
            count += len(events)
            after = events[-1]["seq"]
        if data["terminal"] and not data["has_more"]:
            if link:
                raise AssertionError("the last page named a next one")
            break
        if not follow_next:
            conn.request("GET", f"/api/runs/{run_id}/events?after_seq={after}&limit={page}", headers=headers)
        elif not link:
            raise AssertionError("a page with more after it named no next one")
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed, count


PROFILE_SECONDS = 10


def profile_replays(
    out: Path, db: str, pid: int, port: int, cookie: str, session_id: int, run_id: int, page: int
) -> None:
    """py-spy the web process (raw collapsed stacks) while it serves one kind of replay after another."""
    out.mkdir(parents=True, exist_ok=True)
    kinds = {
        "ws": lambda: asyncio.run(replay_websocket(port, cookie, session_id, run_id)),
        "poll": lambda: replay_polling(port, cookie, run_id, page, follow_next=True),
    }
    for kind, replay in kinds.items():
        spy = S.start_profile(pid, PROFILE_SECONDS, out / f"replay-{db}-{kind}.txt")
        if spy is None:
            return
        S.log(f"replay {db}: profiling the {kind} replay for {PROFILE_SECONDS} s")
        deadline = time.monotonic() + PROFILE_SECONDS
        while time.monotonic() < deadline:
            replay()
        spy.wait()


@dataclass
class Pass:
    """One measured pass: events/s of each reader, and CPU µs per event of the web and of this client."""

    rate: dict[str, float] = field(default_factory=dict)
    web_us: dict[str, float] = field(default_factory=dict)
    client_us: dict[str, float] = field(default_factory=dict)


def timed(n: int, read: Callable[[], int]) -> float:
    start = time.perf_counter()
    got = read()
    assert got == n, f"a raw read returned {got} of {n} events"
    return n / (time.perf_counter() - start)


def measure_pass(
    n: int, daphne_pid: int, port: int, cookie: str, session_id: int, run_id: int, page: int, *, orm: bool
) -> Pass:
    """Raw SQL pages, then each replay, in one pass: the ceiling is taken beside what it divides.

    With this process's garbage collector paused, as timeit does: its full passes walk the
    loaded Django and whatever the last read left, in series with the reads (a replay's client
    CPU went from ~100 to ~150 ms in the passes it struck). Not the product's time.
    """
    gc.collect()
    gc.disable()
    try:
        return measure_pass_timed(n, daphne_pid, port, cookie, session_id, run_id, page, orm=orm)
    finally:
        gc.enable()


def measure_pass_timed(
    n: int, daphne_pid: int, port: int, cookie: str, session_id: int, run_id: int, page: int, *, orm: bool
) -> Pass:
    result = Pass()
    if orm:
        result.rate["orm"] = timed(n, lambda: read_orm(run_id, page))
    result.rate["raw"] = timed(n, lambda: read_raw(run_id, page))
    replays: dict[str, Callable[[], tuple[float, int]]] = {
        "ws": lambda: asyncio.run(replay_websocket(port, cookie, session_id, run_id)),
        "poll": lambda: replay_polling(port, cookie, run_id, page),
        "poll-next": lambda: replay_polling(port, cookie, run_id, page, follow_next=True),
    }
    for key, replay in replays.items():
        web, client = S.cpu_seconds(daphne_pid), time.process_time()
        elapsed, got = replay()
        assert got == n, f"{key} replay delivered {got} of {n} events"
        result.rate[key] = n / elapsed
        result.web_us[key] = 1e6 * (S.cpu_seconds(daphne_pid) - web) / n
        result.client_us[key] = 1e6 * (time.process_time() - client) / n
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--db", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--events", type=int)
    parser.add_argument("--quick", action="store_true", help="a 10k-event run")
    parser.add_argument("--json", help="append result rows to this file (bench/run)")
    parser.add_argument(
        "--passes",
        type=int,
        default=3,
        help="measured passes after one warm-up (at least 3): each figure is the median of its passes",
    )
    parser.add_argument(
        "--profile", type=Path, help="then py-spy the web process over repeated replays of each kind into DIR"
    )
    args = parser.parse_args()
    n = args.events or (10_000 if args.quick else 100_000)
    bench = S.setup(args.db, redis=args.db == "postgres", name=f"replay-{args.db}")
    from django.conf import settings

    page = settings.HERMESWEB_EVENTS_PAGE_MAX
    S.log(f"replay {args.db}: writing a {n}-event run")
    owner, session_id, run_id = build_run(n)
    cookie = S.session_cookie(owner)
    daphne, port = S.start_daphne("hermesweb.asgi:application", bench.env, bench.data_dir / "logs")
    passes: list[Pass] = []
    try:
        # The warm-up pass fills the database's cache and daphne's imports; it is not reported.
        S.log(f"replay {args.db}: warm-up pass")
        measure_pass(n, daphne.pid, port, cookie, session_id, run_id, page, orm=False)
        # A single raw pass ranged 93k-648k ev/s between runs: each figure is a median of
        # passes that alternate the ceiling with the replays it divides.
        for attempt in range(max(args.passes, 3)):
            S.log(f"replay {args.db}: raw SQL pages, WebSocket, polling API (pass {attempt + 1})")
            passes.append(
                measure_pass(n, daphne.pid, port, cookie, session_id, run_id, page, orm=attempt == 0)
            )
        if args.profile:
            profile_replays(args.profile, args.db, daphne.pid, port, cookie, session_id, run_id, page)
    finally:
        daphne.stop()
    S.emit(result_rows(args.db, n, page, passes), args.json)


def result_rows(db: str, n: int, page: int, passes: list[Pass]) -> list[S.Row]:
    label = "PostgreSQL" if db == "postgres" else "SQLite"
    raw = statistics.median(p.rate["raw"] for p in passes)
    raws = sorted(p.rate["raw"] for p in passes)
    rows = []
    figures = {
        "ws": ("WebSocket", True),
        "poll-next": (f"polling API, pages of {page}, following the next links", True),
        # The client of earlier rounds: it reads the next cursor from the parsed page, so its
        # parsing and the web's next page take turns. Shown beside, with no target of its own.
        "poll": (f"polling API, pages of {page}, cursor read from the page", False),
    }
    for key, (figure, targeted) in figures.items():
        value = statistics.median(p.rate[key] for p in passes)
        web_us = statistics.median(p.web_us[key] for p in passes)
        client_us = statistics.median(p.client_us[key] for p in passes)
        per_pass = " / ".join(f"{p.rate[key] / p.rate['raw']:.2f}" for p in passes)
        rows.append(
            S.Row(
                bench="replay",
                figure=f"{label}: {n // 1000}k events from seq 0, {figure}",
                value=value,
                unit="ev/s",
                higher_is_better=True,
                baseline="ORM values_list pages",
                baseline_value=passes[0].rate["orm"],
                ceiling="raw SQL pages",
                ceiling_value=raw,
                note=(
                    f"median of {len(passes)} passes; web CPU {web_us:.2f} µs/event "
                    f"({web_us * value / 1e4:.0f}% of a core), client {client_us:.2f} µs/event; "
                    f"raw {S.fmt(raws[0], 'ev/s')} to {S.fmt(raws[-1], 'ev/s')}; per pass {per_pass}"
                ),
                extra={"web_us_per_event": web_us, "client_us_per_event": client_us},
            )
        )
        if targeted:
            rows.append(
                S.ratio_row(
                    "replay",
                    f"{label}: {figure} ÷ raw SQL pages",
                    value,
                    raw,
                    unit="ev/s",
                    limit=OF_RAW_SQL,
                    at_most=False,
                    what=f"(medians of {len(passes)} passes; web {web_us:.2f} µs/event)",
                )
            )
    return rows


if __name__ == "__main__":
    main()
