"""Shared plumbing for the benchmarks: databases, processes, /proc stats, result rows.

Processes, ports and waiting come from tests/support/procs.py (plain Python, no pytest).
Every benchmark makes its own data directory and database — a SQLite file
in a temp dir, or a PostgreSQL database `hermesweb_bench_<pid>` it creates and drops —
and never touches the developer's `var/` or the dev database.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support import procs  # noqa: E402 - needs REPO on the path
from tests.support.procs import free_port, wait_for  # noqa: E402

PG_ADMIN_URL = os.environ.get("HERMESWEB_BENCH_PG_ADMIN", "postgres://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("HERMESWEB_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
SECRET_KEY = "bench-only-not-a-secret-bench-only-not-a-secret-0123456789"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- database and Django


@dataclass
class BenchEnv:
    """One benchmark's data directory, database and Redis prefix; `env` is for its subprocesses."""

    db: str  # "sqlite" | "postgres"
    redis: bool
    data_dir: Path
    pg_name: str = ""
    redis_prefix: str = ""
    env: dict[str, str] = field(default_factory=dict)

    @property
    def database_url(self) -> str:
        if self.db == "postgres":
            return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + self.pg_name
        return ""

    def cleanup(self) -> None:
        with contextlib.suppress(Exception):
            from django.db import connections

            connections.close_all()
        if self.pg_name:
            _drop_pg(self.pg_name)
        shutil.rmtree(self.data_dir, ignore_errors=True)


def _pg_admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql)


def _drop_pg(name: str) -> None:
    with contextlib.suppress(Exception):
        _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def setup(db: str, *, redis: bool, name: str, **extra_env: str) -> BenchEnv:
    """Point this process at a fresh database, run migrate, and return the environment for children.

    SQLite is the embedded default (no DATABASE_URL): settings then add WAL and
    synchronous=NORMAL, which is the configuration users actually run. `{data_dir}` in
    an extra value becomes this benchmark's data directory.
    """
    if db not in ("sqlite", "postgres"):
        raise SystemExit(f"--db must be sqlite or postgres, not {db!r}")
    data_dir = Path(tempfile.mkdtemp(prefix=f"hermesweb-bench-{name}-"))
    (data_dir / "projects").mkdir()
    bench = BenchEnv(db=db, redis=redis, data_dir=data_dir)
    env = {
        # HERMESWEB_BENCH_SETTINGS: measure a settings variant (a module that star-imports
        # hermesweb.settings and changes something) before adopting it.
        "DJANGO_SETTINGS_MODULE": os.environ.get("HERMESWEB_BENCH_SETTINGS", "hermesweb.settings"),
        "HERMESWEB_DATA_DIR": str(data_dir),
        "HERMESWEB_ALLOWED_ROOTS": str(data_dir / "projects"),
        "SECRET_KEY": SECRET_KEY,
        "HERMESWEB_LOG_LEVEL": "WARNING",
        # Benchmarks open thousands of sockets as one user: past the per-user cap's default (100).
        "HERMESWEB_MAX_SOCKETS_PER_USER": "1000000",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
    }
    os.environ.pop("DATABASE_URL", None)
    os.environ.pop("REDIS_URL", None)
    if db == "postgres":
        bench.pg_name = f"hermesweb_bench_{os.getpid()}"
        _drop_pg(bench.pg_name)
        _pg_admin(f'CREATE DATABASE "{bench.pg_name}"')
        env["DATABASE_URL"] = bench.database_url
    if redis:
        bench.redis_prefix = f"hwbench-{uuid.uuid4().hex[:8]}"
        env["REDIS_URL"] = REDIS_URL
        env["HERMESWEB_REDIS_PREFIX"] = bench.redis_prefix
    env.update({name: value.replace("{data_dir}", str(data_dir)) for name, value in extra_env.items()})
    os.environ.update(env)
    bench.env = dict(os.environ)
    atexit.register(bench.cleanup)
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))

    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    return bench


def django_for_child() -> None:
    """A benchmark's own subprocess: the parent already exported the environment and migrated."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import django

    django.setup()


def make_owner(username: str = "bench") -> Any:
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    user = user_model.objects.filter(username=username).first()
    if user is None:
        # A real hasher would cost ~0.3 s; nobody signs in with this password.
        user = user_model(username=username, is_staff=False)
        user.set_unusable_password()
        user.save()
    return user


def make_project(owner: Any, agent: str = "demo", name: str = "bench") -> Any:
    from django.conf import settings

    from projects.models import Project

    root = Path(settings.HERMESWEB_ALLOWED_ROOTS[0])
    path = Path(tempfile.mkdtemp(prefix="project-", dir=root)).resolve()
    slug = f"{name}-{uuid.uuid4().hex[:6]}"
    return Project.objects.create(name=name, slug=slug, path=str(path), agent=agent, owner=owner)


def make_session(owner: Any, agent: str = "demo", project_name: str = "bench", project: Any = None) -> Any:
    """A session in `project`, or in a project of its own."""
    from projects.models import Session

    return Session.objects.create(project=project or make_project(owner, agent, project_name))


def session_cookie(user: Any) -> str:
    from django.test import Client

    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def running_run(session: Any) -> Any:
    from runs.models import Run, RunStatus

    return Run.objects.create(
        session=session, client_id=uuid.uuid4().hex, prompt_text="bench", status=RunStatus.RUNNING
    )


# ---------------------------------------------------------------- processes


class Proc(procs.Proc):
    """A subprocess of ours (tests/support/procs.py's), stopped at exit if a benchmark forgets."""

    def __init__(self, name: str, args: Sequence[str], env: dict[str, str], log_dir: Path) -> None:
        super().__init__(name, list(args), env, log_dir)
        _live_procs.append(self)

    def log(self, tail: int = 4000) -> str:
        return super().log()[-tail:]

    def stop(self, timeout: float = 15.0) -> int | None:
        try:
            return super().stop(timeout)
        finally:
            with contextlib.suppress(ValueError):
                _live_procs.remove(self)


_live_procs: list[Proc] = []


@atexit.register
def _stop_all() -> None:
    for proc in reversed(list(_live_procs)):
        with contextlib.suppress(Exception):
            proc.stop(5)


def wait_listening(proc: Proc, port: int, timeout: float = 30.0) -> None:
    def listening() -> bool:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited:\n{proc.log()}")
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    wait_for(listening, timeout, what=f"{proc.name} to listen on {port}")


def start_daphne(app: str, env: dict[str, str], log_dir: Path, name: str = "daphne") -> tuple[Proc, int]:
    port = free_port()
    args = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), app]
    proc = Proc(name, args, env, log_dir)
    wait_listening(proc, port)
    return proc, port


def start_runner(env: dict[str, str], log_dir: Path, runner_id: str = "bench", entry: str = "") -> Proc:
    # HERMESWEB_BENCH_RUNNER_WRAP: a script run instead of manage.py (instrumenting the runner).
    entry = entry or os.environ.get("HERMESWEB_BENCH_RUNNER_WRAP", "manage.py")
    return Proc(f"runner-{runner_id}", [sys.executable, entry, "runner", "--id", runner_id], env, log_dir)


def start_profile(pid: int, seconds: float, out: Path) -> subprocess.Popen[bytes] | None:
    """py-spy on one of our processes for `seconds` (raw collapsed stacks to `out`), if installed."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not os.access(spy, os.X_OK):
        log("py-spy is not installed: no profile")
        return None
    args = [
        spy,
        "record",
        "--pid",
        str(pid),
        "-d",
        str(int(seconds)),
        "-r",
        "250",
        "-f",
        "raw",
        # Without it py-spy stops the process for every sample, which slows what it measures.
        "--nonblocking",
        "-o",
        str(out),
    ]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# ---------------------------------------------------------------- /proc (no psutil needed)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_or_zero(pid: int) -> float:
    """RSS in MiB of a process that may have exited meanwhile (0)."""
    try:
        return rss_mib(pid)
    except OSError:
        return 0.0


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError), open(f"/proc/{entry}/stat") as f:
            if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def descendants(pid: int) -> list[int]:
    """Children, their children, and so on: an agent in the sandbox is bwrap's grandchild."""
    found = []
    for child in children(pid):
        found += [child, *descendants(child)]
    return found


class CpuMeter:
    """CPU% of some pids over an interval (100% = one core)."""

    def __init__(self, pids: Iterable[int]) -> None:
        self.pids = list(pids)
        self.start_wall = time.monotonic()
        self.start = {pid: _safe_cpu(pid) for pid in self.pids}

    def percent(self) -> dict[int, float]:
        wall = time.monotonic() - self.start_wall
        return {pid: 100 * (_safe_cpu(pid) - self.start[pid]) / wall for pid in self.pids}


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine so far, from /proc/stat."""
    fields = [float(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_percent(start: tuple[float, float], end: tuple[float, float]) -> float:
    """Machine CPU use between two machine_busy() readings, 100% = every core busy."""
    return 100 * (end[0] - start[0]) / max(end[1] - start[1], 1e-9)


def wait_quiet(busy_below: float = 10.0, most_seconds: float = 10.0, sample: float = 0.5) -> float:
    """Wait until the whole machine was under `busy_below`% busy for one `sample`, or give up.

    What a benchmark left running (a database's checkpoint, a process winding down) lands in the
    next one's window otherwise. Returns the last sample's busy %.
    """
    deadline = time.monotonic() + most_seconds
    while True:
        start = machine_busy()
        time.sleep(sample)
        busy = busy_percent(start, machine_busy())
        if busy < busy_below or time.monotonic() >= deadline:
            return busy


def _safe_cpu(pid: int) -> float:
    try:
        return cpu_seconds(pid)
    except OSError:
        return 0.0


# ---------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of unsorted values; nan when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


# ---------------------------------------------------------------- result rows and the table


@dataclass
class Row:
    """One figure beside its same-run baseline (and, where one exists, the ceiling).

    `higher_is_better` decides the direction of `gain` (always > 1 when hermesweb wins)
    and of the target check.
    """

    bench: str
    figure: str
    value: float
    unit: str
    higher_is_better: bool
    baseline: str = ""
    baseline_value: float = math.nan
    ceiling: str = ""
    ceiling_value: float = math.nan
    target: float | None = None
    target_text: str = ""
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # The machine's 1-minute load average when the figure was taken (2 cores, shared).
    load: float = field(default_factory=lambda: os.getloadavg()[0])

    def _ratio(self, other: float) -> float:
        if math.isnan(other) or math.isnan(self.value) or other <= 0 or self.value <= 0:
            return math.nan
        return self.value / other if self.higher_is_better else other / self.value

    @property
    def gain(self) -> float:
        return self._ratio(self.baseline_value)

    @property
    def of_ceiling(self) -> float:
        return self._ratio(self.ceiling_value)

    @property
    def result(self) -> str:
        if self.target is None:
            return ""
        if math.isnan(self.value):
            return "MISS"
        ok = self.value >= self.target if self.higher_is_better else self.value <= self.target
        return "PASS" if ok else "MISS"

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(gain=self.gain, of_ceiling=self.of_ceiling, result=self.result)
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in data.items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Row:
        names = {f for f in cls.__dataclass_fields__}
        kwargs = {
            k: (math.nan if v is None and k.endswith("value") else v) for k, v in data.items() if k in names
        }
        return cls(**kwargs)


def ratio_row(
    bench: str,
    figure: str,
    value: float,
    against: float,
    *,
    unit: str,
    limit: float,
    at_most: bool,
    what: str = "",
) -> Row:
    """A target stated as a ratio to a figure measured in the same run: value ÷ against.

    `at_most`: the ratio must stay ≤ limit (times), else ≥ limit (rates). Both absolute
    figures stay in the note, as information: they move with the machine's load, the ratio less.
    """
    ratio = value / against if against > 0 and not math.isnan(value) else math.nan
    return Row(
        bench=bench,
        figure=figure,
        value=ratio,
        unit="x",
        higher_is_better=not at_most,
        target=limit,
        target_text=f"{'≤' if at_most else '≥'} {limit:g}x",
        note=f"{fmt(value, unit)} ÷ {fmt(against, unit)}" + (f" {what}" if what else ""),
    )


def difference_row(
    bench: str, figure: str, value: float, minus: float, *, limit: float, what: str = ""
) -> Row:
    """A target stated as a difference of two figures of the same run, in ms: value - minus ≤ limit."""
    return Row(
        bench=bench,
        figure=figure,
        value=value - minus,
        unit="ms",
        higher_is_better=False,
        target=limit,
        target_text=f"≤ {limit:g} ms",
        note=f"{fmt(value, 'ms')} - {fmt(minus, 'ms')}" + (f" {what}" if what else ""),
    )


def fmt(value: float, unit: str = "") -> str:
    if value is None or math.isnan(value):
        return "—"
    if abs(value) >= 10_000:
        text = f"{value / 1000:,.0f}k" if abs(value) < 10_000_000 else f"{value / 1e6:,.1f}M"
    elif abs(value) >= 100:
        text = f"{value:,.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}"
    return f"{text} {unit}".strip()


def table(rows: Sequence[Row]) -> str:
    head = [
        "benchmark",
        "figure",
        "hermesweb",
        "baseline",
        "gain x",
        "ceiling",
        "of ceiling",
        "target",
        "result",
        "load",
    ]
    lines = []
    for r in rows:
        base = f"{fmt(r.baseline_value, r.unit)} ({r.baseline})" if r.baseline else "—"
        ceil = f"{fmt(r.ceiling_value, r.unit)} ({r.ceiling})" if r.ceiling else "—"
        of_ceiling = "—" if math.isnan(r.of_ceiling) else f"{100 * r.of_ceiling:.0f}%"
        lines.append(
            [
                r.bench,
                r.figure,
                fmt(r.value, r.unit),
                base,
                "—" if math.isnan(r.gain) else f"{r.gain:.1f}x",
                ceil,
                of_ceiling,
                r.target_text or "—",
                r.result or "—",
                f"{r.load:.1f}",
            ]
        )
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(head)]
    out = [" | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    out.append("-+-".join("-" * w for w in widths))
    out += [" | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines]
    notes = [f"  {r.bench} / {r.figure}: {r.note}" for r in rows if r.note]
    if notes:
        out += ["", "notes:", *notes]
    return "\n".join(out)


def targets_table(rows: Sequence[Row]) -> str:
    """Only the rows with a target: each one's figure, target and PASS/MISS, with the load beside it."""
    picked = [r for r in rows if r.target is not None]
    head = ["benchmark", "target figure", "measured", "target", "result", "load", "figures"]
    lines = [
        [r.bench, r.figure, fmt(r.value, r.unit), r.target_text, r.result, f"{r.load:.1f}", r.note]
        for r in picked
    ]
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(head)]
    out = [" | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip()]
    out.append("-+-".join("-" * w for w in widths))
    out += [" | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines]
    return "\n".join(out)


def emit(rows: Sequence[Row], json_path: str | None) -> None:
    """Print this benchmark's table; append its rows to `json_path` for bench/run's summary."""
    print(table(rows), flush=True)
    if json_path:
        with open(json_path, "a") as f:
            for row in rows:
                f.write(json.dumps(row.as_dict()) + "\n")


def load_rows(json_path: str) -> list[Row]:
    with open(json_path) as f:
        return [Row.from_dict(json.loads(line)) for line in f if line.strip()]


def arguments(doc: str | None, quick: str = "smaller and shorter") -> argparse.ArgumentParser:
    """A benchmark's command line, with the two options bench/run passes every one."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--json", help="append result rows to this file (bench/run)")
    return parser


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
