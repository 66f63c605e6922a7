"""Live fan-out: N WebSocket viewers of one run whose journal grows at E events/s.

Three servers, each measured in the same run against the same emitter:
- hermesweb: daphne + hermesweb.asgi (runs/live/consumer.py, runs/live/feed.py), authenticated
  sockets speaking the /ws/sessions/{id}/ protocol, the Redis pubsub doorbell.
- naive (baseline): daphne + bench/naive_asgi.py, one consumer and one channels_redis
  core-layer group_send per event.
- raw (ceiling): bench/raw_server.py, `websockets.broadcast` fed by the same doorbell.

Latency cases run as alternating pairs on sockets that stay open: at each viewer count with a
target (50, 200) `--rounds` rounds (3) of raw then hermesweb, the next hermesweb then raw, each
round a new run of the same session; the naive baseline runs once. Each figure is the median
over its rounds; the target's ratio is the median of the pairs' p99 ratios (hermesweb ÷ raw).

The emitter (bench/fanout_emitter.py, one process for every round) appends as the runner does —
JournalWriter.flush: runs.journal.append_batch's transaction in a database thread, then the
publish from the event loop — so the commit and the publish-after-commit are inside the measured
path. Each event carries the wall-clock time taken just before its append; latency is the client's
receive time minus that. Delivered events/s counts every event the clients received inside
the measured window, whether it came alone (`event` frame) or with others (`events` frame:
hermesweb sends a notification's batch in one; the baselines send a frame per event).

usage: python bench/fanout.py [--quick] [--viewers 1,50,200] [--rounds 3] [--rate 100] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson

from bench import _support as S
from bench import _ws

VARIANTS = ("hermesweb", "naive", "raw")
# Issue #25: fan-out p99 at 100 events/s as a multiple of the raw `websockets` ceiling, same run.
P99_OF_CEILING = {50: 1.25, 200: 1.5}


# ---------------------------------------------------------------- emitter (its own process)


class Emitter:
    """bench/fanout_emitter.py, started once: each round's appends without a Django start-up."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, bench: S.BenchEnv) -> Emitter:
        args = [sys.executable, "-m", "bench.fanout_emitter"]
        pipe = asyncio.subprocess.PIPE
        return cls(
            await asyncio.create_subprocess_exec(*args, cwd=S.REPO, env=bench.env, stdin=pipe, stdout=pipe)
        )

    async def emit(self, *args: str) -> dict[str, Any]:
        """One round: the emitter's command line for it, its result."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((json.dumps(args) + "\n").encode())
        while line := await self.proc.stdout.readline():
            if line.startswith(b"{"):  # its answer; anything else is something a library printed
                return json.loads(line)
        raise RuntimeError(f"emitter failed ({await self.proc.wait()})")

    async def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        await self.proc.wait()


# ---------------------------------------------------------------- clients (this process)


@dataclass
class Tally:
    run_id: int  # one round's run: a late frame of an earlier round is not this round's
    latencies: list[float] = field(default_factory=list)  # seconds, measured-window events only
    sent: list[float] = field(default_factory=list)  # each latency's emit time (the event's `t`)
    buckets: dict[int, int] = field(default_factory=dict)  # 10 ms receive-time bucket → event frames
    events: int = 0
    terminals: int = 0
    snapshots: int = 0
    errors: list[bytes] = field(default_factory=list)

    def on_frame(self, payload: bytes, now: float) -> None:
        message = orjson.loads(payload)
        kind = message.get("type")
        if kind in ("event", "events"):
            for event in _ws.envelopes(message):
                if event["run_id"] != self.run_id:
                    continue
                self.events += 1
                bucket = int(now * 100)
                self.buckets[bucket] = self.buckets.get(bucket, 0) + 1
                data = event["payload"]
                if data.get("w"):
                    self.latencies.append(now - data["t"])
                    self.sent.append(data["t"])
                if event["terminal"]:
                    self.terminals += 1
        elif kind == "session":
            self.snapshots += 1
        elif kind == "error":
            self.errors.append(payload)

    def frames_between(self, t0: float, t1: float) -> int:
        low, high = int(t0 * 100), int(t1 * 100)
        return sum(n for bucket, n in self.buckets.items() if low <= bucket < high)


@dataclass
class Case:
    variant: str
    viewers: int
    rate: float
    batch: int
    p50_ms: float
    p99_ms: float
    frames_per_s: float
    offered_per_s: float
    lost: int
    server_cpu: float
    client_cpu: float
    emitter: dict[str, Any]
    # Latency minus the event's own append (commit + publish): what delivery added after it.
    after_append_p50_ms: float = float("nan")
    after_append_p99_ms: float = float("nan")


class Server:
    def __init__(self, variant: str, bench: S.BenchEnv, log_dir: Path) -> None:
        self.variant = variant
        if variant == "raw":
            port = S.free_port()
            self.proc = S.Proc(
                "raw", [sys.executable, "-m", "bench.raw_server", str(port)], bench.env, log_dir
            )
            S.wait_listening(self.proc, port)
        else:
            app = "hermesweb.asgi:application" if variant == "hermesweb" else "bench.naive_asgi:application"
            self.proc, port = S.start_daphne(app, bench.env, log_dir, name=f"daphne-{variant}")
        self.port = port


@dataclass
class Viewers:
    """One server's N sockets on one session, open for several rounds: each round a new run."""

    server: Server
    session: Any
    clients: list[Any]
    tallies: list[Tally]  # this round's, one per socket (replaced by each round)

    @classmethod
    async def open(cls, server: Server, owner: Any, cookie: str, n: int) -> Viewers:
        from asgiref.sync import sync_to_async

        session = await sync_to_async(S.make_session)(owner, project_name="fanout")
        viewers = cls(server, session, [], [Tally(0) for _ in range(n)])

        def on_frame(i: int) -> _ws.OnFrame:
            return lambda payload, now: viewers.tallies[i].on_frame(payload, now)

        viewers.clients = await _ws.connect_many(
            n,
            server.port,
            f"/ws/sessions/{session.pk}/",
            on_frame,
            cookie=cookie,
            origin=f"http://127.0.0.1:{server.port}",
        )
        if server.variant == "hermesweb":
            for client in viewers.clients:
                client.send_json({"type": "subscribe", "after": {}})
            await _until(lambda: all(t.snapshots for t in viewers.tallies), 180, "session snapshots")
        else:
            await asyncio.sleep(0.3)  # group membership happens right after the handshake
        return viewers

    def close(self) -> None:
        for client in self.clients:
            client.close()


async def run_round(
    viewers: Viewers,
    emitter: Emitter,
    rate: float,
    batch: int,
    seconds: float,
    warmup: float,
    profile: Path | None = None,
) -> Case:
    """One run of the session at `rate` events/s, every socket's latency from emit to receive."""
    from asgiref.sync import sync_to_async

    server = viewers.server
    run = await sync_to_async(S.running_run)(viewers.session)
    tallies = viewers.tallies = [Tally(run.pk) for _ in viewers.clients]
    n = len(tallies)
    mode = "naive" if server.variant == "naive" else "hermesweb"
    round_args = [
        "--run", str(run.pk), "--session", str(viewers.session.pk), "--rate", str(rate),
        "--batch", str(batch), "--seconds", str(seconds), "--warmup", str(warmup), "--mode", mode,
    ]  # fmt: skip
    emitted = asyncio.ensure_future(emitter.emit(*round_args))
    spy = None
    if profile is not None and server.variant == "hermesweb":
        profile.mkdir(parents=True, exist_ok=True)
        spy = S.start_profile(server.proc.pid, warmup + seconds, profile / f"fanout-{n}-web.txt")
    server_cpu = S.CpuMeter([server.proc.pid])
    client_cpu = S.CpuMeter([os.getpid()])
    info = await emitted
    if spy is not None:
        await asyncio.to_thread(spy.wait)
    cpu_server = server_cpu.percent()[server.proc.pid]
    cpu_client = next(iter(client_cpu.percent().values()))
    # Drain: every viewer should get the terminal event; a lagging server gets a few seconds.
    with contextlib.suppress(TimeoutError):
        await _until(lambda: all(t.terminals for t in tallies), 2 + seconds, "")
    latencies = [lat for t in tallies for lat in t.latencies]
    took = {sent: seconds for sent, seconds in info.pop("appends")}
    after = [
        lat - took[sent]
        for t in tallies
        for lat, sent in zip(t.latencies, t.sent, strict=True)
        if sent in took
    ]
    window = info["t1"] - info["t0"]
    frames = sum(t.frames_between(info["t0"], info["t1"]) for t in tallies)
    expected = (info["emitted"] + 1) * n
    errors = [e for t in tallies for e in t.errors]
    if errors:
        S.log(f"{server.variant}: {len(errors)} error frames, first: {errors[0][:200]!r}")
    return Case(
        variant=server.variant,
        viewers=n,
        rate=rate,
        batch=batch,
        p50_ms=1000 * S.percentile(latencies, 50),
        p99_ms=1000 * S.percentile(latencies, 99),
        frames_per_s=frames / window,
        offered_per_s=info["achieved_rate"] * n,
        lost=expected - sum(t.events for t in tallies),
        server_cpu=cpu_server,
        client_cpu=cpu_client,
        emitter=info,
        after_append_p50_ms=1000 * S.percentile(after, 50) if after else float("nan"),
        after_append_p99_ms=1000 * S.percentile(after, 99) if after else float("nan"),
    )


async def _until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


# ---------------------------------------------------------------- the plan: alternating pairs

# Which servers a round measures, in order. The target's ceiling and hermesweb alternate (raw
# first, then hermesweb first, …) on sockets that stay open: the load this shared machine
# carries drifts, and a ratio is only fair between neighbours.
PAIR = ("raw", "hermesweb")


@dataclass
class Plan:
    viewers: list[int]
    rate: float
    seconds: float
    warmup: float
    rounds: int  # pairs per viewer count that has a target; one pair for the others
    variants: list[str]
    tp_viewers: int
    tp_rate: float
    tp_batch: int
    saturation: bool
    profile: Path | None  # py-spy the web during each viewer count's first pair


Cases = dict[tuple[str, str], list[Case]]


async def measure(plan: Plan, bench: S.BenchEnv, owner: Any, cookie: str, log_dir: Path) -> Cases:
    servers = {variant: Server(variant, bench, log_dir) for variant in plan.variants}
    emitter = await Emitter.start(bench)
    cases: Cases = {}
    try:
        for n in plan.viewers:
            await _latency_cases(plan, n, servers, emitter, owner, cookie, cases)
        if plan.saturation:
            for server in servers.values():
                S.log(
                    f"fanout {server.variant}: {plan.tp_viewers} viewers @ {plan.tp_rate:g} ev/s saturation"
                )
                viewers = await Viewers.open(server, owner, cookie, plan.tp_viewers)
                try:
                    case = await run_round(
                        viewers, emitter, plan.tp_rate, plan.tp_batch, plan.seconds, plan.warmup
                    )
                finally:
                    viewers.close()
                cases.setdefault((server.variant, "tp"), []).append(case)
    finally:
        await emitter.stop()
        for server in servers.values():
            server.proc.stop()
    return cases


async def _latency_cases(
    plan: Plan, n: int, servers: dict[str, Server], emitter: Emitter, owner: Any, cookie: str, cases: Cases
) -> None:
    key = f"lat{n}"
    opened = {variant: await Viewers.open(server, owner, cookie, n) for variant, server in servers.items()}
    try:
        # Off the pair (the naive baseline): one round, first.
        for variant in [v for v in opened if v not in PAIR]:
            S.log(f"fanout {variant}: {n} viewers @ {plan.rate:g} ev/s")
            case = await run_round(opened[variant], emitter, plan.rate, 1, plan.seconds, plan.warmup)
            cases.setdefault((variant, key), []).append(case)
        rounds = plan.rounds if n in P99_OF_CEILING else 1
        for r in range(rounds):
            order = PAIR if r % 2 == 0 else PAIR[::-1]
            for variant in [v for v in order if v in opened]:
                S.log(f"fanout {variant}: {n} viewers @ {plan.rate:g} ev/s, pair {r + 1}/{rounds}")
                profile = plan.profile if r == 0 else None
                case = await run_round(
                    opened[variant], emitter, plan.rate, 1, plan.seconds, plan.warmup, profile
                )
                cases.setdefault((variant, key), []).append(case)
    finally:
        for viewers in opened.values():
            viewers.close()


# ---------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="50 viewers only, 2-s windows (~25 s)")
    parser.add_argument("--viewers", help="comma-separated viewer counts (default 1,50,200)")
    parser.add_argument("--rate", type=float, default=100.0, help="events/s for the latency cases")
    parser.add_argument("--seconds", type=float, help="measured window per round (default 3)")
    parser.add_argument("--rounds", type=int, help="raw/hermesweb pairs per targeted count (3; quick 1)")
    parser.add_argument("--throughput-viewers", type=int, help="viewers for the saturation case (200)")
    parser.add_argument("--throughput-rate", type=float, default=2000.0, help="events/s offered (2000)")
    parser.add_argument("--throughput-batch", type=int, default=50, help="events per append (50)")
    parser.add_argument("--no-saturation", action="store_true", help="the latency cases only")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--profile", type=Path, help="py-spy the hermesweb web process per case into DIR")
    parser.add_argument("--json", help="append result rows to this file (bench/run)")
    args = parser.parse_args()
    plan = Plan(
        viewers=[int(v) for v in (args.viewers or ("50" if args.quick else "1,50,200")).split(",")],
        rate=args.rate,
        seconds=args.seconds or (2.0 if args.quick else 3.0),
        warmup=0.5 if args.quick else 1.0,
        rounds=args.rounds or (1 if args.quick else 3),
        variants=[v for v in args.variants.split(",") if v],
        tp_viewers=args.throughput_viewers or (50 if args.quick else 200),
        tp_rate=args.throughput_rate,
        tp_batch=args.throughput_batch,
        saturation=not args.no_saturation,
        profile=args.profile,
    )
    bench = S.setup("postgres", redis=True, name="fanout")
    owner = S.make_owner()
    cookie = S.session_cookie(owner)
    cases = asyncio.run(measure(plan, bench, owner, cookie, bench.data_dir / "logs"))
    for (variant, key), runs in cases.items():
        for i, case in enumerate(runs):
            S.log(
                f"{variant:9} {key:6} #{i + 1} p50 {case.p50_ms:7.2f} ms  p99 {case.p99_ms:8.2f} ms  "
                f"{case.frames_per_s:9.0f} frames/s (offered {case.offered_per_s:.0f})  lost {case.lost}  "
                f"server CPU {case.server_cpu:.0f}%  client CPU {case.client_cpu:.0f}%  "
                f"append p50 {case.emitter['append_p50_ms']:.2f} ms  "
                f"after it p50 {case.after_append_p50_ms:.2f} ms p99 {case.after_append_p99_ms:.2f} ms"
            )
    S.emit(rows(cases, plan), args.json)


def median_case(runs: list[Case]) -> Case:
    """The rounds' figures, each the median over the rounds (not one round's); lost: the most."""
    names = ("p50_ms", "p99_ms", "frames_per_s", "offered_per_s", "server_cpu", "client_cpu")
    names += ("after_append_p50_ms", "after_append_p99_ms")
    medians = {name: statistics.median(getattr(case, name) for case in runs) for name in names}
    emitter = {k: statistics.median(c.emitter[k] for c in runs) for k in ("append_p50_ms", "append_p99_ms")}
    return dataclasses.replace(runs[0], lost=max(c.lost for c in runs), emitter=emitter, **medians)


def pair_ratios(cases: Cases, key: str) -> list[float]:
    """hermesweb's p99 ÷ the raw ceiling's, per alternating pair (round r of each)."""
    ours, ceiling = cases.get(("hermesweb", key), []), cases.get(("raw", key), [])
    return [h.p99_ms / r.p99_ms for h, r in zip(ours, ceiling, strict=False) if r.p99_ms > 0]


def rows(cases_by_round: Cases, plan: Plan) -> list[S.Row]:
    import math

    cases = {key: median_case(runs) for key, runs in cases_by_round.items()}
    rate, tp_viewers, tp_rate = plan.rate, plan.tp_viewers, plan.tp_rate

    def get(variant: str, key: str, attr: str) -> float:
        case = cases.get((variant, key))
        return float(getattr(case, attr)) if case else math.nan

    def row(figure: str, key: str, attr: str, note: str = "", **extra: Any) -> S.Row:
        """hermesweb's figure beside the naive baseline's and the raw ceiling's (medians of rounds)."""
        return S.Row(
            bench="fanout",
            figure=figure,
            value=get("hermesweb", key, attr),
            unit="ms" if attr.endswith("_ms") else "/s",
            higher_is_better=not attr.endswith("_ms"),
            baseline="naive Channels",
            baseline_value=get("naive", key, attr),
            ceiling="raw websockets",
            ceiling_value=get("raw", key, attr),
            note=note,
            extra=extra,
        )

    out: list[S.Row] = []
    for n in plan.viewers:
        key, viewers = f"lat{n}", f"{n} viewer{'s' * (n > 1)}"
        case = cases.get(("hermesweb", key))
        out.append(row(f"p50 emit→receive, {viewers} @ {rate:g} ev/s", key, "p50_ms"))
        note = ""
        if case:
            appended, after = case.emitter, get("raw", key, "after_append_p99_ms")
            note = (
                f"of which the emitter's append (commit + publish): p50 {appended['append_p50_ms']:.1f} ms, "
                f"p99 {appended['append_p99_ms']:.1f} ms; after the append p99 "
                f"{case.after_append_p99_ms:.1f} ms (raw websockets {after:.1f} ms)"
            )
        out.append(
            row(f"p99 emit→receive, {viewers} @ {rate:g} ev/s", key, "p99_ms", note, lost=case and case.lost)
        )
        out.append(
            row(f"delivered events/s, {viewers} @ {rate:g} ev/s", key, "frames_per_s", _loss_note(cases, key))
        )
    hw = cases.get(("hermesweb", "tp"))
    cpu = f"web CPU {hw.server_cpu:.0f}%, client CPU {hw.client_cpu:.0f}%" if hw else ""
    note = "; ".join(part for part in (_loss_note(cases, "tp"), cpu) if part)
    out.append(
        row(
            f"saturation events/s delivered, {tp_viewers} viewers, {tp_rate:g} ev/s offered",
            "tp",
            "frames_per_s",
            note,
        )
    )
    for n, limit in P99_OF_CEILING.items():
        if n in plan.viewers and rate == 100:
            ratios = pair_ratios(cases_by_round, f"lat{n}")
            out.append(
                S.Row(
                    bench="fanout",
                    figure=f"p99 emit→receive, {n} viewers @ 100 ev/s ÷ raw websockets ceiling",
                    value=statistics.median(ratios) if ratios else math.nan,
                    unit="x",
                    higher_is_better=False,
                    target=limit,
                    target_text=f"≤ {limit:g}x",
                    note=(
                        f"the median of {len(ratios)} alternating pairs' ratios "
                        f"({', '.join(f'{r:.2f}' for r in ratios)}); median p99s "
                        f"{S.fmt(get('hermesweb', f'lat{n}', 'p99_ms'), 'ms')} ÷ "
                        f"{S.fmt(get('raw', f'lat{n}', 'p99_ms'), 'ms')}"
                    ),
                )
            )
    hw_tp, raw_tp, naive_tp = (get(v, "tp", "frames_per_s") for v in ("hermesweb", "raw", "naive"))
    out.append(
        S.ratio_row(
            "fanout",
            f"saturation events/s delivered, {tp_viewers} viewers ÷ raw websockets ceiling",
            hw_tp,
            raw_tp,
            unit="/s",
            limit=1.0,
            at_most=False,
        )
    )
    out.append(
        S.Row(
            bench="fanout",
            figure="saturation gain over naive Channels",
            value=hw_tp / naive_tp if naive_tp > 0 else math.nan,
            unit="x",
            higher_is_better=True,
            target=10.0,
            target_text="≥ 10x",
        )
    )
    return out


def _loss_note(cases: dict[tuple[str, str], Case], key: str) -> str:
    # hermesweb holds a slow socket's overflow back and re-reads it from the database; the
    # naive layer drops past its channel capacity; raw queues in the server's buffers.
    parts = [f"{v} {c.lost}" for (v, k), c in cases.items() if k == key and c.lost]
    return "frames not yet received when the drain ended: " + ", ".join(parts) if parts else ""


if __name__ == "__main__":
    main()
