"""Real web and runner processes for integration tests.

The subprocesses share the test database (pytest-django's, so tests using
them need `transaction=True` for the rows to be visible) and the test's data
directory. Each process logs to a file the test can show on failure.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def database_url() -> str:
    conf = connection.settings_dict
    if conf["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{conf['NAME']}"
    user = conf.get("USER") or "postgres"
    host = conf.get("HOST") or "127.0.0.1"
    port = conf.get("PORT") or 5432
    return f"postgres://{user}@{host}:{port}/{conf['NAME']}"


def process_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    # Where the environment forbids bytecode files (PYTHONDONTWRITEBYTECODE, as this box's image
    # sets it), every runner and daphne compiled the project's modules again, ~0.25 s of CPU each;
    # now the first writes them (to the gitignored __pycache__/) and the others read them.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(
        {
            "DJANGO_SETTINGS_MODULE": "hermesweb.settings",
            "DATABASE_URL": database_url(),
            "SECRET_KEY": settings.SECRET_KEY,
            "HERMESWEB_DATA_DIR": str(settings.DATA_DIR),
            "HERMESWEB_ALLOWED_ROOTS": ",".join(str(r) for r in settings.HERMESWEB_ALLOWED_ROOTS),
            "HERMESWEB_LEASE_SECONDS": str(settings.HERMESWEB_LEASE_SECONDS),
            "HERMESWEB_RUNNER_POLL_SECONDS": "0.05",
            "PYTHONUNBUFFERED": "1",
        }
    )
    if settings.REDIS_URL:
        env["REDIS_URL"] = settings.REDIS_URL
    env.update(extra)
    return env


def wait_for(
    predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.05, what: str = ""
) -> Any:
    """Poll a condition until it holds; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


class Proc:
    def __init__(self, name: str, args: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(args, cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            self.popen.send_signal(sig)

    def kill9(self) -> None:
        self.signal(signal.SIGKILL)
        self.popen.wait(10)

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        self._log.close()
        return self.popen.returncode


def start_runner(log_dir: Path, runner_id: str | None = None, **env: str) -> Proc:
    # Teardown stops runners with SIGTERM: a turn left waiting on an approval would hold the
    # drain for the whole production grace (20 s). A test about draining states its own.
    env.setdefault("HERMESWEB_SHUTDOWN_GRACE_SECONDS", "2")
    args = [sys.executable, "manage.py", "runner"]
    if runner_id:
        args += ["--id", runner_id]
    return Proc(f"runner-{runner_id or 'x'}", args, process_env(**env), log_dir)


def start_daphne(log_dir: Path, port: int | None = None, **env: str) -> tuple[Proc, int]:
    port = port or free_port()
    args = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "hermesweb.asgi:application"]
    proc = Proc("daphne", args, process_env(**env), log_dir)

    def listening() -> bool:
        if not proc.alive():
            raise AssertionError(f"daphne exited:\n{proc.log()}")
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    wait_for(listening, 30, what="daphne to listen")
    return proc, port
