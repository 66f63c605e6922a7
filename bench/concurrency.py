"""Concurrency: R runs streaming at once on one runner, 50 tokens/s each.

A real daphne, a real runner (`manage.py runner`) and real agent processes — the demo
agent, wrapped by bench/stamp_agent.py so that each chunk carries the time it was sent
(one agent process per project, `--per-project` sessions each). Every session has one
WebSocket viewer, so the web process does its real work too.

- journal lag: for every token sent inside the measured window, the row's created_at
  (taken in the runner's transaction, just before the insert) minus the agent's send
  time; and the viewer's receive time minus the send time (committed, published, fanned out).
- baseline: the same with a single run, measured just before.
- web, runner and agent processes: CPU (100% = one core) over the window, and RSS at its end.

usage: python bench/concurrency.py [--runs 100] [--quick] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _support as S

TOKENS_PER_SECOND = 50
# Issue #25's targets: delivery adds at most 25 ms at p99 above the commit; and the commit at
# p99 with many runs stays within 3x one run alone's (the old "< 100 ms" was ~3x it).
VIEWER_AFTER_ROW_MS = 25.0
COMMIT_OF_ONE_RUN = 3.0


@dataclass
class Outcome:
    runs: int
    lag_commit: list[float] = field(default_factory=list)
    lag_viewer: list[float] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)
    rss: dict[str, float] = field(default_factory=dict)
    completed: int = 0
    ended_early: int = 0
    tokens: int = 0
    seconds: float = 0.0


def agents_env() -> dict[str, str]:
    agents = {
        "bench": {
            "command": sys.executable,
            "args": ["-m", "bench.stamp_agent", "--home", "{data_dir}/stamp-agent"],
            "env": {"PYTHONPATH": str(S.REPO), "HERMESWEB_DEMO_DELAY": str(1 / TOKENS_PER_SECOND)},
            "steer": "slash",
        }
    }
    return {"HERMESWEB_AGENTS": json.dumps(agents)}


async def measure(
    port: int,
    runner: S.Proc,
    daphne: S.Proc,
    runs: int,
    per_project: int,
    seconds: float,
    profile: Path | None,
) -> Outcome:
    import orjson
    from asgiref.sync import sync_to_async

    from bench import _ws
    from bench.stamp_agent import STAMP
    from runs.models import JournalEvent, Run
    from runs.services import do_submit_message

    owner = await sync_to_async(S.make_owner)()
    cookie = await sync_to_async(S.session_cookie)(owner)
    sessions = []
    for index in range(runs):
        if index % per_project == 0:
            project = await sync_to_async(S.make_project)(owner, agent="bench", name="conc")
        sessions.append(await sync_to_async(S.make_session)(owner, project=project))

    outcome = Outcome(runs=runs, seconds=seconds)
    window = {"t0": float("inf"), "t1": float("inf")}
    snapshots: set[int] = set()

    def viewer(session_id: int) -> _ws.OnFrame:
        def on_frame(payload: bytes, now: float) -> None:
            message = orjson.loads(payload)
            kind = message.get("type")
            if kind == "session":
                snapshots.add(session_id)
            for event in _ws.envelopes(message):
                if event["type"] != "token.delta":
                    continue
                for stamp in STAMP.findall(event["payload"].get("delta", "")):
                    sent = float(stamp)
                    if window["t0"] <= sent < window["t1"]:
                        outcome.lag_viewer.append(now - sent)

        return on_frame

    clients = []
    for session in sessions:
        client = await _ws.connect(
            port,
            f"/ws/sessions/{session.pk}/",
            viewer(session.pk),
            cookie=cookie,
            origin=f"http://127.0.0.1:{port}",
        )
        client.send_json({"type": "subscribe", "after": {}})
        clients.append(client)
    deadline = time.monotonic() + 60
    while len(snapshots) < runs and time.monotonic() < deadline:
        await asyncio.sleep(0.05)

    # Long enough to stream through the ramp-up, the window and a margin: a run that ends
    # inside the window would measure its ending, not streaming (counted: `ended_early`).
    ramp = 3.0 + runs * 0.25
    chunks = int(TOKENS_PER_SECOND * (ramp + seconds + 3))
    started = time.time()
    run_ids = []
    for session in sessions:
        result = await sync_to_async(do_submit_message)(
            session, client_id=uuid.uuid4().hex, text=f"stream {chunks}"
        )
        run_ids.append(result.run_id)

    async def all_streaming() -> bool:
        count = await sync_to_async(
            lambda: (
                JournalEvent.objects.filter(run_id__in=run_ids, type="token.delta")
                .values("run_id")
                .distinct()
                .count()
            )
        )()
        return count == runs

    while not await all_streaming():
        if time.time() - started > 120:
            raise RuntimeError(f"not all runs streaming after 120 s:\n{runner.log()}")
        await asyncio.sleep(0.2)
    S.log(f"concurrency: {runs} runs streaming after {time.time() - started:.1f} s")
    await asyncio.sleep(1.0)
    agent_pids = S.descendants(runner.pid)
    pids = {"web": [daphne.pid], "runner": [runner.pid], "agents": agent_pids}
    meter = S.CpuMeter([daphne.pid, runner.pid, *agent_pids])
    machine_start = S.machine_busy()
    spies = []
    if profile is not None:
        profile.mkdir(parents=True, exist_ok=True)
        for name, pid in (("runner", runner.pid), ("web", daphne.pid)):
            spies.append(S.start_profile(pid, seconds, profile / f"concurrency-{runs}-{name}.txt"))
    window["t0"] = time.time()
    await asyncio.sleep(seconds)
    window["t1"] = time.time()
    for spy in spies:
        if spy is not None:
            await asyncio.to_thread(spy.wait)
    percent = meter.percent()
    outcome.cpu = {name: sum(percent[p] for p in group) for name, group in pids.items()}
    outcome.cpu["machine"] = S.busy_percent(machine_start, S.machine_busy())
    outcome.rss = {name: sum(S.rss_or_zero(p) for p in group) for name, group in pids.items()}
    outcome.rss["agents_count"] = float(len(agent_pids))

    def finished() -> int:
        return Run.objects.filter(pk__in=run_ids, status="completed").count()

    while (done := await sync_to_async(finished)()) < runs:
        if time.time() - window["t1"] > ramp + 60:
            S.log(f"concurrency: only {done} of {runs} runs completed")
            break
        await asyncio.sleep(0.5)
    outcome.completed = await sync_to_async(finished)()
    outcome.ended_early = await sync_to_async(
        lambda: Run.objects.filter(
            pk__in=run_ids, finished_at__lt=datetime.fromtimestamp(window["t1"], UTC)
        ).count()
    )()
    for client in clients:
        client.close()

    def commit_lags() -> list[float]:
        lags = []
        dump = []
        rows = JournalEvent.objects.filter(run_id__in=run_ids, type="token.delta").values_list(
            "created_at", "payload"
        )
        for created_at, payload in rows:
            at = created_at.timestamp()
            for stamp in STAMP.findall(payload.get("delta", "")):
                sent = float(stamp)
                if window["t0"] <= sent < window["t1"]:
                    lags.append(at - sent)
                    dump.append((sent, at - sent))
        if os.environ.get("HERMESWEB_BENCH_DUMP_LAGS"):
            Path(os.environ["HERMESWEB_BENCH_DUMP_LAGS"]).write_text(json.dumps(sorted(dump)))
        return lags

    outcome.lag_commit = await sync_to_async(commit_lags)()
    outcome.tokens = len(outcome.lag_commit)
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, help="concurrent runs (100; 10 with --quick)")
    parser.add_argument("--per-project", type=int, default=10, help="sessions sharing one agent process (10)")
    parser.add_argument("--seconds", type=float, help="measured window (10 s; 3 with --quick)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--profile", type=Path, help="py-spy the runner and web during the window into DIR")
    parser.add_argument("--json", help="append result rows to this file (bench/run)")
    args = parser.parse_args()
    runs = args.runs or (10 if args.quick else 100)
    seconds = args.seconds or (3.0 if args.quick else 10.0)

    bench = S.setup("postgres", redis=True, name="concurrency", **agents_env())
    log_dir = bench.data_dir / "logs"
    log_dir.mkdir(exist_ok=True)
    daphne, port = S.start_daphne("hermesweb.asgi:application", bench.env, log_dir)
    results: dict[int, Outcome] = {}
    try:
        for count in (1, runs):
            runner = S.start_runner(bench.env, log_dir, runner_id=f"bench-{count}")
            try:
                S.log(f"concurrency: {count} run(s) at {TOKENS_PER_SECOND} tokens/s, window {seconds:g} s")
                results[count] = asyncio.run(
                    measure(port, runner, daphne, count, args.per_project, seconds, args.profile)
                )
            finally:
                runner.stop(timeout=30)
    finally:
        daphne.stop()
    emit(results, runs, args.json)


def emit(results: dict[int, Outcome], runs: int, json_path: str | None) -> None:
    one, many = results[1], results[runs]
    for n, outcome in results.items():
        S.log(
            f"{n:4} runs: {outcome.tokens} tokens in window, completed {outcome.completed}/{n}; "
            f"commit lag p50 {1000 * S.percentile(outcome.lag_commit, 50):.1f} ms "
            f"p99 {1000 * S.percentile(outcome.lag_commit, 99):.1f} ms; viewer lag p50 "
            f"{1000 * S.percentile(outcome.lag_viewer, 50):.1f} ms "
            f"p99 {1000 * S.percentile(outcome.lag_viewer, 99):.1f} ms; "
            f"CPU {outcome.cpu}; RSS MiB {outcome.rss}"
        )

    def lag(outcome: Outcome, which: str, q: float) -> float:
        return 1000 * S.percentile(getattr(outcome, which), q)

    rows: list[S.Row] = []
    for which, what in (
        ("lag_commit", "agent send → row committed"),
        ("lag_viewer", "agent send → viewer receives"),
    ):
        for q in (50, 99):
            rows.append(
                S.Row(
                    bench="concurrency",
                    figure=f"{runs} runs @ {TOKENS_PER_SECOND} tok/s: p{q} {what}",
                    value=lag(many, which, q),
                    unit="ms",
                    higher_is_better=False,
                    baseline="1 run alone",
                    baseline_value=lag(one, which, q),
                    note=(
                        f"{many.tokens} tokens sent in the {many.seconds:g}-s window, of "
                        f"{runs * TOKENS_PER_SECOND * many.seconds:.0f} asked for; "
                        f"{many.completed}/{runs} runs completed ({many.ended_early} before the "
                        "window's end); the whole machine was "
                        f"{many.cpu['machine']:.0f}% busy (all cores)"
                        if which == "lag_commit" and q == 99
                        else ""
                    ),
                )
            )
    rows.append(
        S.difference_row(
            "concurrency",
            f"{runs} runs: p99 send → viewer minus p99 send → row",
            lag(many, "lag_viewer", 99),
            lag(many, "lag_commit", 99),
            limit=VIEWER_AFTER_ROW_MS,
            what="(what delivery adds to the commit)",
        )
    )
    rows.append(
        S.ratio_row(
            "concurrency",
            f"{runs} runs: p99 send → row ÷ 1 run alone",
            lag(many, "lag_commit", 99),
            lag(one, "lag_commit", 99),
            unit="ms",
            limit=COMMIT_OF_ONE_RUN,
            at_most=True,
        )
    )
    for name in ("web", "runner", "agents"):
        rows.append(
            S.Row(
                bench="concurrency",
                figure=f"{runs} runs: {name} CPU (100% = 1 core)",
                value=many.cpu[name],
                unit="%",
                higher_is_better=False,
                baseline="1 run alone",
                baseline_value=one.cpu[name],
            )
        )
        rows.append(
            S.Row(
                bench="concurrency",
                figure=f"{runs} runs: {name} RSS"
                + (f" ({many.rss['agents_count']:.0f} processes)" if name == "agents" else ""),
                value=many.rss[name],
                unit="MiB",
                higher_is_better=False,
                baseline="1 run alone",
                baseline_value=one.rss[name],
            )
        )
    S.emit(rows, json_path)


if __name__ == "__main__":
    main()
