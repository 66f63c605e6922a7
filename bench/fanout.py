"""Live fan-out: N WebSocket viewers of one run whose journal grows at E events/s.

Three servers, each measured in the same run against the same emitter:
- hermesweb: daphne + hermesweb.asgi (runs/live/consumer.py, runs/live/feed.py), authenticated
  sockets speaking the /ws/sessions/{id}/ protocol, the Redis pubsub doorbell.
- naive (baseline): daphne + bench/naive_asgi.py, one consumer and one channels_redis
  core-layer group_send per event.
- raw (ceiling): bench/raw_server.py, `websockets.broadcast` fed by the same doorbell.

The emitter is a separate process that appends as the runner does — JournalWriter.flush:
runs.journal.append_batch's transaction in a database thread, then the publish from the
event loop — so the commit and the publish-after-commit are inside the measured path. Each event
carries the wall-clock time taken just before its append; latency is the client's
receive time minus that. Delivered events/s counts every event the clients received inside
the measured window, whether it came alone (`event` frame) or with others (`events` frame:
hermesweb sends a notification's batch in one; the baselines send a frame per event).

usage: python bench/fanout.py [--quick] [--viewers 1,50,200] [--rate 100] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _support as S

VARIANTS = ("hermesweb", "naive", "raw")
DELTA = "the quick brown fox jumps "
# Issue #25: fan-out p99 at 100 events/s as a multiple of the raw `websockets` ceiling, same run.
P99_OF_CEILING = {50: 1.25, 200: 1.5}  # a few tokens, as a coalesced delta carries


# ---------------------------------------------------------------- emitter (its own process)


def emitter_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", type=int, required=True)
    parser.add_argument("--session", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--warmup", type=float, required=True)
    parser.add_argument("--mode", choices=("hermesweb", "naive"), required=True)
    args = parser.parse_args(argv)
    S.django_for_child()
    print(json.dumps(asyncio.run(_emit(args))), flush=True)


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
        inside = measure_from <= now < measure_to
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


# ---------------------------------------------------------------- clients (this process)


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)  # seconds, measured-window events only
    sent: list[float] = field(default_factory=list)  # each latency's emit time (the event's `t`)
    buckets: dict[int, int] = field(default_factory=dict)  # 10 ms receive-time bucket → event frames
    events: int = 0
    terminals: int = 0
    snapshots: int = 0
    errors: list[bytes] = field(default_factory=list)

    def on_frame(self, payload: bytes, now: float) -> None:
        import orjson

        from bench import _ws

        message = orjson.loads(payload)
        kind = message.get("type")
        if kind in ("event", "events"):
            for event in _ws.envelopes(message):
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

    def stop(self) -> None:
        self.proc.stop()


async def run_case(
    server: Server,
    bench: S.BenchEnv,
    owner: Any,
    cookie: str,
    viewers: int,
    rate: float,
    batch: int,
    seconds: float,
    warmup: float,
    profile: Path | None = None,
) -> Case:
    from asgiref.sync import sync_to_async

    from bench import _ws

    session = await sync_to_async(S.make_session)(owner, project_name="fanout")
    run = await sync_to_async(S.running_run)(session)
    tallies = [Tally() for _ in range(viewers)]
    origin = f"http://127.0.0.1:{server.port}"
    clients = await _ws.connect_many(
        viewers,
        server.port,
        f"/ws/sessions/{session.pk}/",
        lambda i: tallies[i].on_frame,
        cookie=cookie,
        origin=origin,
    )
    if server.variant == "hermesweb":
        for client in clients:
            client.send_json({"type": "subscribe", "after": {}})
        await _until(lambda: all(t.snapshots for t in tallies), 180, "session snapshots")
    else:
        await asyncio.sleep(0.3)  # group membership happens right after the handshake
    mode = "naive" if server.variant == "naive" else "hermesweb"
    args = [
        sys.executable, "-m", "bench.fanout", "_emit", "--run", str(run.pk), "--session", str(session.pk),
        "--rate", str(rate), "--batch", str(batch), "--seconds", str(seconds), "--warmup", str(warmup),
        "--mode", mode,
    ]  # fmt: skip
    emitter = await asyncio.create_subprocess_exec(
        *args, cwd=S.REPO, env=bench.env, stdout=asyncio.subprocess.PIPE
    )
    spy = None
    if profile is not None and server.variant == "hermesweb":
        profile.mkdir(parents=True, exist_ok=True)
        spy = S.start_profile(server.proc.pid, warmup + seconds, profile / f"fanout-{viewers}-web.txt")
    server_cpu = S.CpuMeter([server.proc.pid])
    client_cpu = S.CpuMeter([__import__("os").getpid()])
    out, _ = await emitter.communicate()
    if spy is not None:
        await asyncio.to_thread(spy.wait)
    cpu_server = server_cpu.percent()[server.proc.pid]
    cpu_client = next(iter(client_cpu.percent().values()))
    if emitter.returncode != 0:
        raise RuntimeError(f"emitter failed ({emitter.returncode})")
    info = json.loads(out.decode().strip().splitlines()[-1])
    # Drain: every viewer should get the terminal event; a lagging server gets a few seconds.
    with __import__("contextlib").suppress(TimeoutError):
        await _until(lambda: all(t.terminals for t in tallies), 2 + seconds, "")
    for client in clients:
        client.close()
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
    expected = (info["emitted"] + 1) * viewers
    errors = [e for t in tallies for e in t.errors]
    if errors:
        S.log(f"{server.variant}: {len(errors)} error frames, first: {errors[0][:200]!r}")
    return Case(
        variant=server.variant,
        viewers=viewers,
        rate=rate,
        batch=batch,
        p50_ms=1000 * S.percentile(latencies, 50),
        p99_ms=1000 * S.percentile(latencies, 99),
        frames_per_s=frames / window,
        offered_per_s=info["achieved_rate"] * viewers,
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


# ---------------------------------------------------------------- main


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_emit":
        emitter_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="50 viewers only, 2-s windows (~25 s)")
    parser.add_argument("--viewers", help="comma-separated viewer counts (default 1,50,200)")
    parser.add_argument("--rate", type=float, default=100.0, help="events/s for the latency cases")
    parser.add_argument("--seconds", type=float, help="measured window per case")
    parser.add_argument("--throughput-viewers", type=int, help="viewers for the saturation case (200)")
    parser.add_argument("--throughput-rate", type=float, default=2000.0, help="events/s offered (2000)")
    parser.add_argument("--throughput-batch", type=int, default=50, help="events per append (50)")
    parser.add_argument("--no-saturation", action="store_true", help="the latency cases only")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--profile", type=Path, help="py-spy the hermesweb web process per case into DIR")
    parser.add_argument("--json", help="append result rows to this file (bench/run)")
    args = parser.parse_args()
    viewers = [int(v) for v in (args.viewers or ("50" if args.quick else "1,50,200")).split(",")]
    seconds = args.seconds or (2.0 if args.quick else 4.0)
    warmup = 0.5 if args.quick else 1.0
    tp_viewers = args.throughput_viewers or (50 if args.quick else 200)
    variants = [v for v in args.variants.split(",") if v]

    bench = S.setup("postgres", redis=True, name="fanout")
    owner = S.make_owner()
    cookie = S.session_cookie(owner)
    log_dir = bench.data_dir / "logs"
    cases: dict[tuple[str, str], Case] = {}

    async def measure() -> None:
        # All servers up at once and variants interleaved per case: the other load on this
        # shared machine drifts, and a baseline is only comparable when measured alongside.
        servers = [Server(variant, bench, log_dir) for variant in variants]
        plan = [(f"lat{n}", n, args.rate, 1) for n in viewers]
        if not args.no_saturation:
            plan.append(("tp", tp_viewers, args.throughput_rate, args.throughput_batch))
        try:
            for key, n, rate, batch in plan:
                for server in servers:
                    S.log(f"fanout {server.variant}: {n} viewers @ {rate:g} ev/s in batches of {batch}")
                    cases[(server.variant, key)] = await run_case(
                        server, bench, owner, cookie, n, rate, batch, seconds, warmup, args.profile
                    )
        finally:
            for server in servers:
                server.stop()

    asyncio.run(measure())
    for (variant, key), case in cases.items():
        S.log(
            f"{variant:9} {key:6} p50 {case.p50_ms:7.2f} ms  p99 {case.p99_ms:8.2f} ms  "
            f"{case.frames_per_s:9.0f} frames/s (offered {case.offered_per_s:.0f})  lost {case.lost}  "
            f"server CPU {case.server_cpu:.0f}%  client CPU {case.client_cpu:.0f}%  "
            f"append p50 {case.emitter['append_p50_ms']:.2f} ms  "
            f"after it p50 {case.after_append_p50_ms:.2f} ms p99 {case.after_append_p99_ms:.2f} ms"
        )
    S.emit(rows(cases, viewers, args.rate, tp_viewers, args.throughput_rate), args.json)


def rows(
    cases: dict[tuple[str, str], Case], viewers: list[int], rate: float, tp_viewers: int, tp_rate: float
) -> list[S.Row]:
    import math

    def get(variant: str, key: str, attr: str) -> float:
        case = cases.get((variant, key))
        return float(getattr(case, attr)) if case else math.nan

    out: list[S.Row] = []
    for n in viewers:
        key = f"lat{n}"
        for pct in ("p50", "p99"):
            attr = f"{pct}_ms"
            case = cases.get(("hermesweb", key))
            out.append(
                S.Row(
                    bench="fanout",
                    figure=f"{pct} emit→receive, {n} viewer{'s' * (n > 1)} @ {rate:g} ev/s",
                    value=get("hermesweb", key, attr),
                    unit="ms",
                    higher_is_better=False,
                    baseline="naive Channels",
                    baseline_value=get("naive", key, attr),
                    ceiling="raw websockets",
                    ceiling_value=get("raw", key, attr),
                    note=(
                        f"of which the emitter's append (commit + publish): p50 "
                        f"{case.emitter['append_p50_ms']:.1f} ms, "
                        f"p99 {case.emitter['append_p99_ms']:.1f} ms; "
                        f"after the append p99 {case.after_append_p99_ms:.1f} ms"
                        f" (raw websockets {get('raw', key, 'after_append_p99_ms'):.1f} ms)"
                        if case and pct == "p99"
                        else ""
                    ),
                    extra={"lost": case.lost if case else None},
                )
            )
        out.append(
            S.Row(
                bench="fanout",
                figure=f"delivered events/s, {n} viewer{'s' * (n > 1)} @ {rate:g} ev/s",
                value=get("hermesweb", key, "frames_per_s"),
                unit="/s",
                higher_is_better=True,
                baseline="naive Channels",
                baseline_value=get("naive", key, "frames_per_s"),
                ceiling="raw websockets",
                ceiling_value=get("raw", key, "frames_per_s"),
                note=_loss_note(cases, key),
            )
        )
    hw = cases.get(("hermesweb", "tp"))
    out.append(
        S.Row(
            bench="fanout",
            figure=f"saturation events/s delivered, {tp_viewers} viewers, {tp_rate:g} ev/s offered",
            value=get("hermesweb", "tp", "frames_per_s"),
            unit="/s",
            higher_is_better=True,
            baseline="naive Channels",
            baseline_value=get("naive", "tp", "frames_per_s"),
            ceiling="raw websockets",
            ceiling_value=get("raw", "tp", "frames_per_s"),
            note="; ".join(
                part
                for part in (
                    _loss_note(cases, "tp"),
                    f"web CPU {hw.server_cpu:.0f}%, client CPU {hw.client_cpu:.0f}%" if hw else "",
                )
                if part
            ),
        )
    )
    for n, limit in P99_OF_CEILING.items():
        if n in viewers and rate == 100:
            out.append(
                S.ratio_row(
                    "fanout",
                    f"p99 emit→receive, {n} viewers @ 100 ev/s ÷ raw websockets ceiling",
                    get("hermesweb", f"lat{n}", "p99_ms"),
                    get("raw", f"lat{n}", "p99_ms"),
                    unit="ms",
                    limit=limit,
                    at_most=True,
                )
            )
    out.append(
        S.ratio_row(
            "fanout",
            f"saturation events/s delivered, {tp_viewers} viewers ÷ raw websockets ceiling",
            get("hermesweb", "tp", "frames_per_s"),
            get("raw", "tp", "frames_per_s"),
            unit="/s",
            limit=1.0,
            at_most=False,
        )
    )
    naive_tp = get("naive", "tp", "frames_per_s")
    hw_tp = get("hermesweb", "tp", "frames_per_s")
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
