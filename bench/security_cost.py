"""What the agent sandbox (bubblewrap) and redaction cost: time to first token and ingest, on vs off.

One daphne and, in turn, runners with redaction on and off (bench/unredacted.py), alternately
(`--rounds` of each). In each, two sessions of the same agent (bench/stamp_agent.py, the demo
agent that can also `stream N`), one whose entry has `sandbox = "auto"` (bwrap when it works,
as deployed) and one with `sandbox = "none"`:
- time to first token: bench/ttft.py's turns the composer's way (submit on the socket → first
  token.delta frame), PAUSE_SECONDS apart, after that script's two warm-up turns;
- ingest through the agent: a turn streaming N chunks as fast as the agent writes them
  (HERMESWEB_DEMO_DELAY=0), events/s from the run's start to its end (the runner's reader,
  writer, redaction and commits; the agent's pipes go through bwrap's namespace or not).
And in this process, the runner's writer alone (bench/ingest.py's mixed feed: deltas and a
tool event in 10) with redaction on and off, alternately: what redaction costs per event.

Needs bwrap (Debian: bubblewrap) for the sandbox to be on; without it both sessions run
unsandboxed, which the note says.

With `--versus network` (the only comparison a root runner can make: it starts no agent
unsandboxed) the plain agent is sandboxed too, with `network = "all"`: the figure is what the
network namespace and the runner's proxy add.

usage: python bench/security_cost.py [--turns 12] [--rounds 2] [--versus sandbox|network] [--quick]
                                     [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _support as S

CONFIGS = [(sandbox, redaction) for redaction in (True, False) for sandbox in (True, False)]


def agents_env(versus: str) -> dict[str, str]:
    """`versus` "sandbox": the plain agent runs unsandboxed; "network": sandboxed, but with the
    host's network (`network = "all"`: no namespace of its own, no proxy)."""

    def entry(sandbox: str, network: str | None = None) -> dict[str, Any]:
        out = {
            "command": sys.executable,
            "args": ["-m", "bench.stamp_agent"],
            "env": {"PYTHONPATH": str(S.REPO), "HERMESWEB_DEMO_DELAY": "0"},
            "steer": "slash",
            "sandbox": sandbox,
        }
        return {**out, "network": network} if network else out

    plain = entry("none") if versus == "sandbox" else entry("auto", "all")
    return {"HERMESWEB_AGENTS": json.dumps({"boxed": entry("auto"), "plain": plain})}


def label(sandbox: bool, redaction: bool) -> str:
    return f"sandbox {'on' if sandbox else 'off'}, redaction {'on' if redaction else 'off'}"


async def stream_rate(session: Any, chunks: int) -> float:
    """A turn streaming `chunks` text chunks as fast as the agent writes: events/s, start to end."""
    from asgiref.sync import sync_to_async

    from runs.models import Run
    from runs.services import do_submit_message

    result = await sync_to_async(do_submit_message)(
        session, client_id=uuid.uuid4().hex, text=f"stream {chunks}"
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        run = await sync_to_async(Run.objects.get)(pk=result.run_id)
        if run.finished_at is not None and run.started_at is not None:
            if run.status != "completed":
                raise RuntimeError(f"stream turn ended {run.status}")
            return chunks / (run.finished_at - run.started_at).total_seconds()
        await asyncio.sleep(0.1)
    raise RuntimeError("stream turn did not end in 120 s")


def phases(
    bench: S.BenchEnv, port: int, cookie: str, token: str, sessions: dict[bool, Any], args: argparse.Namespace
) -> dict[tuple[bool, bool], dict[str, list[float]]]:
    from bench.ttft import through_hermesweb

    out: dict[tuple[bool, bool], dict[str, list[float]]] = {c: {"ttft": [], "ingest": []} for c in CONFIGS}
    log_dir = bench.data_dir / "logs"
    unsandboxed: set[str] = set()
    for round_ in range(args.rounds):
        for redaction in (True, False):
            entry = "" if redaction else str(Path(__file__).with_name("unredacted.py"))
            runner = S.start_runner(bench.env, log_dir, runner_id=f"sec-{round_}-{redaction}", entry=entry)
            try:
                # Alternate which sandbox goes first, so neither always follows a runner's start.
                for sandbox in (True, False) if round_ % 2 == 0 else (False, True):
                    S.log(f"security cost: round {round_ + 1}, {label(sandbox, redaction)}")
                    session = sessions[sandbox]
                    figures = asyncio.run(
                        through_hermesweb(args.turns, port, cookie, token, session.pk, ("socket",))
                    )
                    out[(sandbox, redaction)]["ttft"] += figures["socket"]["first_token"]
                    out[(sandbox, redaction)]["ingest"].append(asyncio.run(stream_rate(session, args.chunks)))
            finally:
                runner.stop()
            unsandboxed |= {line for line in runner.log(100_000).splitlines() if "UNSANDBOXED" in line}
    if not any("'boxed'" in line or "boxed" in line.split("UNSANDBOXED")[0] for line in unsandboxed):
        S.log("security cost: the 'boxed' agent ran in bwrap")
    else:
        S.log("security cost: WARNING: the 'boxed' agent ran unsandboxed (no working bwrap)")
        args.boxed_unsandboxed = True
    return out


def writer_redaction(n: int, pairs: int) -> dict[bool, list[float]]:
    """The runner's writer alone, redaction on and off alternately (bench/ingest.py's mixed feed)."""
    from bench import unredacted
    from bench.ingest import writer_feed

    rates: dict[bool, list[float]] = {True: [], False: []}
    original = unredacted.saved()
    for _ in range(pairs):
        for redaction in (True, False):
            if not redaction:
                unredacted.turn_off()
            try:
                start = time.perf_counter()
                events, _ = writer_feed(n, tool_every=10)
                rates[redaction].append(events / (time.perf_counter() - start))
            finally:
                unredacted.turn_on_again(original)
    return rates


def main() -> None:
    parser = S.arguments(__doc__)
    parser.add_argument("--turns", type=int, help="measured turns per session and phase (12; 5 with --quick)")
    parser.add_argument("--rounds", type=int, help="rounds of redaction on, then off (2; 1 with --quick)")
    parser.add_argument("--chunks", type=int, help="chunks of the streaming turn (5000; 2000 with --quick)")
    parser.add_argument(
        "--versus",
        choices=("sandbox", "network"),
        default="sandbox",
        help="the plain agent: unsandboxed, or sandboxed with the host's network (no proxy)",
    )
    args = parser.parse_args()
    args.turns = args.turns or (5 if args.quick else 12)
    args.rounds = args.rounds or (1 if args.quick else 2)
    args.chunks = args.chunks or (2000 if args.quick else 5000)
    args.boxed_unsandboxed = False
    if args.versus == "sandbox" and os.geteuid() == 0:
        # A root runner starts no agent unsandboxed (docs/security.md): compare the proxy instead.
        S.log("security cost: running as root, so --versus network (the sandbox's network path)")
        args.versus = "network"
    bench = S.setup("postgres", redis=True, name="security", **agents_env(args.versus))
    from hermesweb.models import ApiToken

    owner = S.make_owner()
    cookie = S.session_cookie(owner)
    _, token = ApiToken.issue(owner, name="bench")
    sessions = {True: S.make_session(owner, agent="boxed"), False: S.make_session(owner, agent="plain")}
    daphne, port = S.start_daphne("hermesweb.asgi:application", bench.env, bench.data_dir / "logs")
    try:
        results = phases(bench, port, cookie, token, sessions, args)
    finally:
        daphne.stop()
    S.log("security cost: the runner's writer alone, redaction on and off")
    writer = writer_redaction(int(200_000 * (0.2 if args.quick else 0.5)), 2 if args.quick else 3)

    def p50(config: tuple[bool, bool], what: str) -> float:
        values = results[config][what]
        return S.percentile(values, 50) * (1000 if what == "ttft" else 1)

    note = "the 'boxed' agent ran UNSANDBOXED (no working bwrap)" if args.boxed_unsandboxed else ""
    rows = []
    for what, figure, unit, higher in (
        ("ttft", "p50 submit → first token.delta, via socket", "ms", False),
        ("ingest", "a streaming turn's events/s, agent → journal", "ev/s", True),
    ):
        for config, against, against_label in (
            ((True, True), (False, True), "sandbox off" if args.versus == "sandbox" else "proxy off"),
            ((True, True), (True, False), "redaction off"),
            ((True, True), (False, False), "both off"),
        ):
            rows.append(
                S.Row(
                    bench="security",
                    figure=f"{figure}: both on",
                    value=p50(config, what),
                    unit=unit,
                    higher_is_better=higher,
                    baseline=against_label,
                    baseline_value=p50(against, what),
                    note=note if against_label == "both off" else "",
                )
            )
    rows.append(
        S.Row(
            bench="security",
            figure="the runner's writer alone, deltas + 1 tool event in 10: redaction on (PostgreSQL)",
            value=S.percentile(writer[True], 50),
            unit="ev/s",
            higher_is_better=True,
            baseline="redaction off",
            baseline_value=S.percentile(writer[False], 50),
            note=f"{len(writer[True])} feeds each way, alternately",
        )
    )
    S.log(f"security cost: {json.dumps({label(*c): v for c, v in results.items()})}; writer {writer}")
    S.emit(rows, args.json)


if __name__ == "__main__":
    main()
