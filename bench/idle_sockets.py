"""Idle sockets: the web process's memory for each open, subscribed socket that nothing happens on.

A daphne with hermesweb.asgi (PostgreSQL + Redis, as deployed) gets WARMUP sockets first (imports,
the hub, the journal channel), then N more, each subscribed (`subscribe`, cursor {} → `session`
frame) to a session of its own by default — the worst case: a feed, its group membership and its
tasks per socket. RSS is read after the sockets have sat idle a few seconds; the figure is the
RSS added ÷ N. The same N sockets on bench/raw_server.py (no Django, no ASGI, one pubsub
subscription per session) are the ceiling. CPU while idle is reported beside it: the feeds'
safety poll and the heartbeats.

usage: python bench/idle_sockets.py [--sockets 1000] [--per-session 1] [--quick] [--json FILE]
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _support as S

WARMUP = 20
IDLE_SECONDS = 3.0
# Issue #25: web RSS added per open, subscribed, idle socket.
TARGET_KIB = 50.0


async def open_idle(
    port: int, session_ids: list[int], cookie: str, subscribe: bool
) -> tuple[list[Any], set[int]]:
    """One socket per entry of session_ids, subscribed (if asked) and answered with a snapshot."""
    import orjson

    from bench import _ws

    answered: set[int] = set()

    def on_frame_of(i: int) -> _ws.OnFrame:
        def on_frame(payload: bytes, now: float) -> None:
            if orjson.loads(payload).get("type") == "session":
                answered.add(i)

        return on_frame

    clients = await _ws.connect_many(
        len(session_ids),
        port,
        lambda i: f"/ws/sessions/{session_ids[i]}/",
        on_frame_of,
        cookie=cookie,
        origin=f"http://127.0.0.1:{port}",
    )
    if subscribe:
        for client in clients:
            client.send_json({"type": "subscribe", "after": {}})
        deadline = time.monotonic() + 120
        while len(answered) < len(clients) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if len(answered) < len(clients):
            raise RuntimeError(f"only {len(answered)} of {len(clients)} sockets got their snapshot")
    return clients, answered


async def measure(
    proc: S.Proc, port: int, session_ids: list[int], cookie: str, subscribe: bool
) -> dict[str, float]:
    warm, _ = await open_idle(port, session_ids[:WARMUP], cookie, subscribe)
    await asyncio.sleep(IDLE_SECONDS)
    before = S.rss_mib(proc.pid)
    clients, _ = await open_idle(port, session_ids[WARMUP:], cookie, subscribe)
    await asyncio.sleep(IDLE_SECONDS)
    meter = S.CpuMeter([proc.pid])
    await asyncio.sleep(IDLE_SECONDS)
    cpu = meter.percent()[proc.pid]
    after = S.rss_mib(proc.pid)
    alive = sum(1 for c in clients if not c.closed.done())
    for client in [*warm, *clients]:
        client.close()
    n = len(session_ids) - WARMUP
    return {"kib": 1024 * (after - before) / n, "before": before, "after": after, "cpu": cpu, "alive": alive}


def main() -> None:
    parser = S.arguments(__doc__)
    parser.add_argument("--sockets", type=int, help="idle sockets measured (1000; 200 with --quick)")
    parser.add_argument("--per-session", type=int, default=1, help="sockets sharing one session (1)")
    args = parser.parse_args()
    n = args.sockets or (200 if args.quick else 1000)
    bench = S.setup("postgres", redis=True, name="idle")
    owner = S.make_owner()
    cookie = S.session_cookie(owner)
    project = S.make_project(owner, name="idle")
    total = WARMUP + n
    sessions = [
        S.make_session(owner, project=project).pk
        for _ in range((total + args.per_session - 1) // args.per_session)
    ]
    session_ids = [sessions[i // args.per_session] for i in range(total)]
    log_dir = bench.data_dir / "logs"
    results: dict[str, dict[str, float]] = {}
    daphne, port = S.start_daphne("hermesweb.asgi:application", bench.env, log_dir)
    try:
        S.log(f"idle sockets: {n} subscribed sockets on hermesweb, {args.per_session} per session")
        results["hermesweb"] = asyncio.run(measure(daphne, port, session_ids, cookie, True))
    finally:
        daphne.stop()
    raw_port = S.free_port()
    raw = S.Proc("raw", [sys.executable, "-m", "bench.raw_server", str(raw_port)], bench.env, log_dir)
    try:
        S.wait_listening(raw, raw_port)
        S.log(f"idle sockets: {n} sockets on the raw websockets server")
        results["raw"] = asyncio.run(measure(raw, raw_port, session_ids, cookie, False))
    finally:
        raw.stop()
    hw, ceiling = results["hermesweb"], results["raw"]
    S.log(f"idle sockets: {results}")
    rows = [
        S.Row(
            bench="idle",
            figure=f"web RSS per open, subscribed, idle socket ({n}, {args.per_session} per session)",
            value=hw["kib"],
            unit="KiB",
            higher_is_better=False,
            ceiling="raw websockets",
            ceiling_value=ceiling["kib"],
            target=TARGET_KIB,
            target_text=f"≤ {TARGET_KIB:g} KiB",
            note=(
                f"RSS {hw['before']:.0f} → {hw['after']:.0f} MiB; raw server {ceiling['before']:.0f} → "
                f"{ceiling['after']:.0f} MiB; {hw['alive']:.0f}/{n} sockets open at the end"
            ),
        ),
        S.Row(
            bench="idle",
            figure=f"web CPU with {n + WARMUP} idle subscribed sockets (100% = 1 core)",
            value=hw["cpu"],
            unit="%",
            higher_is_better=False,
            ceiling="raw websockets",
            ceiling_value=ceiling["cpu"],
        ),
    ]
    S.emit(rows, args.json)


if __name__ == "__main__":
    main()
