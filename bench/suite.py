"""The whole benchmark suite, one script after the other, and one table at the end (bench/run).

Each benchmark runs in its own process (Django's database settings are per process)
and appends its rows to a JSON-lines file; the table printed at the end is built from
those rows. Needs PostgreSQL on 127.0.0.1:5432 (user postgres, trust) and Redis on
127.0.0.1:6379, as bin/services provides.

usage: bench/run [--quick] [--only fanout,ingest,…] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _support as S

# (name, script, arguments): the order is cheapest first, so a broken setup fails fast.
BENCHMARKS = [
    ("ingest", "ingest.py", []),
    ("replay-postgres", "replay.py", ["--db", "postgres"]),
    ("replay-sqlite", "replay.py", ["--db", "sqlite"]),
    ("ttft", "ttft.py", []),
    ("fanout", "fanout.py", []),
    ("concurrency", "concurrency.py", []),
    ("idle-sockets", "idle_sockets.py", []),
    ("security-cost", "security_cost.py", []),
    ("scale-out", "scale_out.py", []),
    ("transcript-page", "transcript_page.py", []),
    ("fairness", "fairness.py", []),
    ("warm", "warm.py", []),
]


def services_up() -> list[str]:
    missing = []
    for name, port in (("PostgreSQL", 5432), ("Redis", 6379)):
        with socket.socket() as sock:
            sock.settimeout(2)
            if sock.connect_ex(("127.0.0.1", port)) != 0:
                missing.append(f"{name} on 127.0.0.1:{port}")
    return missing


def machine() -> dict[str, str]:
    import psycopg

    with psycopg.connect(S.PG_ADMIN_URL) as conn:
        pg = str(conn.execute("SHOW server_version").fetchone()[0])  # type: ignore[index]
    import redis

    info = redis.Redis.from_url(S.REDIS_URL).info("server")
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    return {
        "cpus": str(os.cpu_count()),
        "cpu": cpu,
        "memory": f"{int(Path('/proc/meminfo').read_text().split()[1]) // 1024} MiB",
        "python": platform.python_version(),
        "postgresql": pg,
        "redis": str(info.get("redis_version")),
        "kernel": platform.release(),
    }


def _lines(path: str) -> int:
    with open(path) as f:
        return sum(1 for _ in f)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="the ~1-minute smoke: smaller and shorter")
    parser.add_argument("--only", help="comma-separated: " + ", ".join(name for name, _, _ in BENCHMARKS))
    parser.add_argument("--out", help="also write the rows and the machine as JSON to this file")
    args = parser.parse_args()
    missing = services_up()
    if missing:
        raise SystemExit("bench: not reachable: " + ", ".join(missing) + " (bin/services starts them)")
    chosen = [b for b in BENCHMARKS if not args.only or b[0] in args.only.split(",")]
    info = machine()
    load_before = os.getloadavg()
    started = time.monotonic()
    failures = []
    with tempfile.NamedTemporaryFile("w+", suffix=".jsonl", delete=False) as rows_file:
        rows_path = rows_file.name
    timings = {}
    for name, script, extra in chosen:
        command = [sys.executable, str(Path(__file__).with_name(script)), *extra, "--json", rows_path]
        if args.quick:
            command.append("--quick")
        busy = S.wait_quiet()
        S.log(
            f"bench: {name} — {' '.join(command[1:])} "
            f"(load average {os.getloadavg()[0]:.2f}, machine {busy:.0f}% busy)"
        )
        begin = time.monotonic()
        before = _lines(rows_path)
        result = subprocess.run(command, cwd=S.REPO)
        timings[name] = time.monotonic() - begin
        if result.returncode != 0 or _lines(rows_path) == before:
            failures.append(name)  # an exit 0 that printed no figure failed too
    rows = S.load_rows(rows_path)
    os.unlink(rows_path)
    elapsed = time.monotonic() - started
    load_after = os.getloadavg()
    print()
    kind = "quick" if args.quick else "full"
    print(f"hermesweb benchmarks — {time.strftime('%Y-%m-%d %H:%M %Z')}, {kind} run")
    print(
        f"machine: {info['cpus']} CPUs ({info['cpu']}), {info['memory']}; Python {info['python']}, "
        f"PostgreSQL {info['postgresql']}, Redis {info['redis']}"
    )
    print(
        f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}; "
        f"{elapsed:.0f} s ({', '.join(f'{n} {t:.0f} s' for n, t in timings.items())})"
    )
    print()
    print(S.table(rows))
    print()
    print("targets (each a ratio to a figure of this run, or as issue #25 states it; load: 1-min average):")
    print(S.targets_table(rows))
    misses = [r for r in rows if r.result == "MISS"]
    passes = [r for r in rows if r.result == "PASS"]
    print(
        f"\ntargets: {len(passes)} PASS, {len(misses)} MISS"
        + (f"; FAILED: {', '.join(failures)}" if failures else "")
    )
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "machine": info,
                    "load": [load_before[0], load_after[0]],
                    "seconds": elapsed,
                    "quick": args.quick,
                    "rows": [r.as_dict() for r in rows],
                },
                indent=1,
            )
        )
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
