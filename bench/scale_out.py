"""Scale-out: one web process and one runner against two of each, on one PostgreSQL and Redis.

S sessions (10 per project, so 10 per agent process) each have one viewer socket, spread over
the web processes round-robin; each sends its next turn as soon as the last one ended (the
composer's way: a `submit` frame on that socket, the demo agent's "fast …" turn), for a
measured window after a warm-up. Figures: turns completed per second (runs/s) and events
delivered to the viewers per second, for 1 web + 1 runner and for 2 + 2, alternately (`--rounds`);
the CPU of each kind of process over the window and the RSS each extra process adds.

Runners share the queue (claims use SKIP LOCKED); each starts its own agent processes. On this
machine the two cores also run the database, Redis, the agents and this client, so a second
web process or runner can only help while some core is idle: the note gives the machine's CPU.

usage: python bench/scale_out.py [--sessions 20] [--seconds 6] [--rounds 2] [--quick] [--json FILE]
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _support as S

PROMPT = "fast what is in this project"


@dataclass
class Outcome:
    runs: int = 0
    events: int = 0
    seconds: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    rss: dict[str, float] = field(default_factory=dict)
    machine: float = 0.0


async def drive(
    ports: list[int],
    session_ids: list[int],
    cookie: str,
    warmup: float,
    seconds: float,
    procs: dict[str, list[int]],
) -> Outcome:
    """Every session in a closed loop of turns; counts what ends and arrives inside the window."""
    import orjson

    from bench import _ws

    outcome = Outcome(seconds=seconds)
    window = {"t0": float("inf"), "t1": float("inf"), "stop": False}
    clients: list[_ws.WSClient] = []
    snapshots: set[int] = set()
    ended: set[int] = set()  # sessions whose first turn ended: the runners and agents are up
    refusals: list[dict[str, Any]] = []

    def submit(i: int) -> None:
        if not window["stop"]:
            clients[i].send_json({"type": "submit", "client_id": uuid.uuid4().hex, "text": PROMPT})

    def viewer(i: int) -> _ws.OnFrame:
        def on_frame(payload: bytes, now: float) -> None:
            message = orjson.loads(payload)
            if message.get("type") == "session":
                snapshots.add(i)
            elif message.get("type") == "submitted" and "error" in message:
                refusals.append(message["error"])
            for event in _ws.envelopes(message):
                inside = window["t0"] <= now < window["t1"]
                outcome.events += inside
                if event["terminal"]:
                    outcome.runs += inside
                    ended.add(i)
                    submit(i)

        return on_frame

    for i, session_id in enumerate(session_ids):
        port = ports[i % len(ports)]
        clients.append(
            await _ws.connect(
                port,
                f"/ws/sessions/{session_id}/",
                viewer(i),
                cookie=cookie,
                origin=f"http://127.0.0.1:{port}",
            )
        )
        clients[-1].send_json({"type": "subscribe", "after": {}})
    deadline = time.monotonic() + 60
    while len(snapshots) < len(session_ids) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    for i in range(len(clients)):
        submit(i)
    # Processes start slowly on a busy machine: the window opens once every session has had a turn.
    deadline = time.monotonic() + 180
    while len(ended) < len(session_ids) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(warmup)
    # The agent processes started with the first turns.
    procs = {**procs, "agents": [pid for runner in procs["runner"] for pid in S.descendants(runner)]}
    pids = [pid for group in procs.values() for pid in group]
    meter = S.CpuMeter(pids)
    machine = S.machine_busy()
    window["t0"] = time.time()
    await asyncio.sleep(seconds)
    window["t1"] = time.time()
    window["stop"] = True
    percent = meter.percent()
    outcome.machine = S.busy_percent(machine, S.machine_busy())
    outcome.cpu = {name: sum(percent.get(p, 0.0) for p in group) for name, group in procs.items()}
    outcome.rss = {name: sum(S.rss_or_zero(p) for p in group) for name, group in procs.items()}
    await asyncio.sleep(1.0)  # the last turns end; the next configuration starts on a quiet queue
    for client in clients:
        client.close()
    if refusals:
        raise RuntimeError(f"{len(refusals)} submits refused, the first: {refusals[0]}")
    return outcome


def run_config(
    bench: S.BenchEnv,
    count: int,
    tag: str,
    session_ids: list[int],
    cookie: str,
    warmup: float,
    seconds: float,
) -> Outcome:
    log_dir = bench.data_dir / "logs"
    webs: list[S.Proc] = []
    runners: list[S.Proc] = []
    try:
        ports = []
        for i in range(count):
            proc, port = S.start_daphne(
                "hermesweb.asgi:application", bench.env, log_dir, name=f"daphne-{tag}-{i}"
            )
            webs.append(proc)
            ports.append(port)
            runners.append(S.start_runner(bench.env, log_dir, runner_id=f"scale-{tag}-{i}"))
        procs = {"web": [w.pid for w in webs], "runner": [r.pid for r in runners]}

        return asyncio.run(drive(ports, session_ids, cookie, warmup, seconds, procs))
    finally:
        for proc in [*runners, *webs]:
            proc.stop()


def main() -> None:
    parser = S.arguments(__doc__)
    parser.add_argument("--sessions", type=int, help="sessions, each a closed loop of turns (20)")
    parser.add_argument("--seconds", type=float, help="measured window per configuration (6; 4 with --quick)")
    parser.add_argument("--rounds", type=int, help="rounds of 1+1 then 2+2 (2; 1 with --quick)")
    args = parser.parse_args()
    n = args.sessions or 20
    seconds = args.seconds or (4.0 if args.quick else 6.0)
    rounds = args.rounds or (1 if args.quick else 2)
    warmup = 1.0
    bench = S.setup("postgres", redis=True, name="scale")
    owner = S.make_owner()
    cookie = S.session_cookie(owner)
    session_ids: list[int] = []
    project: Any = None
    for i in range(n):
        if i % 10 == 0:
            project = S.make_project(owner, name="scale")
        session_ids.append(S.make_session(owner, project=project).pk)
    results: dict[int, list[Outcome]] = {1: [], 2: []}
    for round_ in range(rounds):
        for count in (1, 2):
            S.log(f"scale-out: round {round_ + 1}, {count} web + {count} runner, {n} sessions")
            outcome = run_config(bench, count, f"{round_}-{count}", session_ids, cookie, warmup, seconds)
            S.log(
                f"scale-out: {count}+{count}: {outcome.runs / seconds:.1f} runs/s, "
                f"{outcome.events / seconds:.0f} events/s; CPU {outcome.cpu}; RSS {outcome.rss}; "
                f"machine {outcome.machine:.0f}%"
            )
            results[count].append(outcome)

    def median(count: int, what: str) -> float:
        return S.percentile([getattr(o, what) / o.seconds for o in results[count]], 50)

    def mean_of(count: int, table: str, name: str) -> float:
        values = [getattr(o, table).get(name, 0.0) for o in results[count]]
        return sum(values) / len(values)

    machine = max(o.machine for outcomes in results.values() for o in outcomes)
    rows = [
        S.Row(
            bench="scale",
            figure=f"{n} sessions, turns back to back: {what} with 2 web + 2 runners",
            value=median(2, key),
            unit="/s",
            higher_is_better=True,
            baseline="1 web + 1 runner",
            baseline_value=median(1, key),
            note=(
                f"median of {rounds} window(s) each, alternately; the machine was up to {machine:.0f}% busy "
                "(all cores); CPU % of a core, 1+1 → 2+2: "
                + ", ".join(
                    f"{name} {mean_of(1, 'cpu', name):.0f} → {mean_of(2, 'cpu', name):.0f}"
                    for name in ("web", "runner", "agents")
                )
                if key == "runs"
                else ""
            ),
        )
        for key, what in (("runs", "turns completed/s"), ("events", "events delivered/s"))
    ]
    for name in ("web", "runner"):
        rows.append(
            S.Row(
                bench="scale",
                figure=f"RSS of the {name} processes, 2 against 1",
                value=mean_of(2, "rss", name),
                unit="MiB",
                higher_is_better=False,
                baseline=f"1 {name}",
                baseline_value=mean_of(1, "rss", name),
            )
        )
    S.emit(rows, args.json)


if __name__ == "__main__":
    main()
