"""The data directory is the service's alone: 0700, every file in it 0600 from its first byte.

It was 0755 with the SQLite database and its WAL 0644: any local account read every session key
and transcript. Every process of ours now sets the umask 0o077 as its settings load, narrows an
existing data directory and SQLite database at start, and `doctor` and `/api/health` warn about
anything still wider (docs/security.md, "The data directory").
"""

from __future__ import annotations

import contextlib
import http.client
import io
import os
import socket
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from tests.support import procs

DB = "hermesweb.sqlite3"


def embedded_env(data_dir: Path) -> dict[str, str]:
    """The quick start's environment: no DATABASE_URL, SECRET_KEY or Redis; this data directory."""
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("HERMESWEB_", "DATABASE_URL", "REDIS_URL"))
    }
    for name in ("SECRET_KEY", "DEBUG", "PYTHONDONTWRITEBYTECODE"):
        base.pop(name, None)
    return {
        **base,
        "DJANGO_SETTINGS_MODULE": "hermesweb.settings",
        "HERMESWEB_DATA_DIR": str(data_dir),
        "HERMESWEB_RUNNER_POLL_SECONDS": "0.05",
        "HERMESWEB_SHUTDOWN_GRACE_SECONDS": "2",
        "PYTHONUNBUFFERED": "1",
    }


@contextlib.contextmanager
def shell_umask() -> Iterator[None]:
    """Processes started here inherit a shell's usual 0o022: what they make private, they do themselves."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def manage(env: dict[str, str], *args: str) -> None:
    with shell_umask():
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=procs.REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
    assert done.returncode == 0, done.stdout + done.stderr


def modes(data_dir: Path) -> dict[str, int]:
    """Every entry of the data directory (itself as "."), by relative path, with its mode."""
    found = {".": stat.S_IMODE(data_dir.lstat().st_mode)}
    for top, dirs, files in os.walk(data_dir):
        for name in dirs + files:
            path = Path(top) / name
            found[str(path.relative_to(data_dir))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def open_to_others(data_dir: Path) -> dict[str, str]:
    return {name: oct(mode) for name, mode in modes(data_dir).items() if mode & 0o077}


def get(port: int, path: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        return connection.getresponse().status
    finally:
        connection.close()


def listening(proc: procs.Proc, port: int) -> bool:
    if not proc.alive():
        raise AssertionError(f"{proc.name} exited:\n{proc.log()}")
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


# ---------------------------------------------------------------- our processes


def test_the_web_a_command_and_the_runner_create_a_fresh_data_directory_owner_only(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    env = embedded_env(data_dir)
    started: list[procs.Proc] = []
    try:
        port = procs.free_port()
        daphne = [sys.executable, "-m", "daphne", "-p", str(port), "hermesweb.asgi:application"]
        with shell_umask():
            started.append(web := procs.Proc("daphne", daphne, env, tmp_path))
        procs.wait_for(lambda: listening(web, port), 60, what="daphne to listen")
        assert get(port, "/login/") == 200
        manage(env, "migrate", "--noinput", "-v0")
        with shell_umask():
            runner = procs.Proc("runner", [sys.executable, "manage.py", "runner"], env, tmp_path)
        started.append(runner)
        # The runner keeps its connection: SQLite's WAL and shared-memory files stay while it runs.
        wal, shm = data_dir / f"{DB}-wal", data_dir / f"{DB}-shm"
        procs.wait_for(
            lambda: runner.alive() and wal.exists() and shm.exists(), 60, what=f"the WAL ({runner.log_path})"
        )

        found = modes(data_dir)
    finally:
        for proc in reversed(started):
            proc.stop()

    assert found["."] == 0o700
    for name in (DB, f"{DB}-wal", f"{DB}-shm", "secret_key"):
        assert found[name] == 0o600, name
    for name in ("logs", "projects"):
        assert found[name] == 0o700, name
    assert open_to_others(data_dir) == {}


def test_an_existing_data_directory_and_database_left_open_are_narrowed_at_start(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o755)
    data_dir.chmod(0o755)
    # What an older version left: a WAL-mode database that SQLite made 0644, as it makes its WALs.
    with shell_umask():
        database = sqlite3.connect(data_dir / DB)
        database.execute("PRAGMA journal_mode=WAL")
        database.close()
    assert stat.S_IMODE((data_dir / DB).stat().st_mode) == 0o644

    manage(embedded_env(data_dir), "migrate", "--noinput", "-v0")

    assert open_to_others(data_dir) == {}
    assert modes(data_dir)["."] == 0o700


def test_collected_static_files_are_readable_by_nginx_outside_the_data_directory(tmp_path: Path) -> None:
    static_root = tmp_path / "static"
    env = {**embedded_env(tmp_path / "data"), "HERMESWEB_STATIC_ROOT": str(static_root)}

    manage(env, "collectstatic", "--noinput", "-v0")

    collected = modes(static_root)
    assert "js/api.js" in collected  # the project's own, and the admin's
    assert "admin/css/base.css" in collected
    assert {oct(mode) for name, mode in collected.items() if (static_root / name).is_dir()} == {"0o755"}
    assert {oct(mode) for name, mode in collected.items() if (static_root / name).is_file()} == {"0o644"}
    assert not (tmp_path / "data" / "static").exists()


# ---------------------------------------------------------------- doctor and /api/health


@pytest.fixture
def loose_data_dir(tmp_path: Path, settings: Any) -> Path:
    """A data directory an operator (or an older version) left open, one level deep and deeper."""
    data_dir = tmp_path / "data"
    (data_dir / "logs").mkdir(parents=True)
    (data_dir / DB).write_text("")
    (data_dir / "logs" / "agent-demo.log").write_text("")
    data_dir.chmod(0o755)
    (data_dir / "logs").chmod(0o700)  # nothing below it is reachable: only doctor walks that far
    (data_dir / DB).chmod(0o644)
    (data_dir / "logs" / "agent-demo.log").chmod(0o644)
    (data_dir / "secret_key").write_text("")
    (data_dir / "secret_key").chmod(0o600)
    settings.DATA_DIR = data_dir
    return data_dir


@pytest.mark.django_db
def test_doctor_warns_about_every_entry_of_the_data_directory_open_to_others(loose_data_dir: Path) -> None:
    out = io.StringIO()
    call_command("doctor", "--skip-agents", stdout=out)
    text = out.getvalue()

    assert f"data directory {loose_data_dir}: modes wider than owner-only" in text
    assert "the data directory is 0755" in text
    assert f"{DB} is 0644" in text
    assert "logs/agent-demo.log is 0644" in text
    assert "secret_key" not in text
    assert f"chmod -R go= {loose_data_dir}" in text


@pytest.mark.django_db
def test_doctor_says_an_owner_only_data_directory_is_fine(loose_data_dir: Path) -> None:
    for path in (loose_data_dir, loose_data_dir / DB, loose_data_dir / "logs" / "agent-demo.log"):
        path.chmod(0o700 if path.is_dir() else 0o600)
    out = io.StringIO()
    call_command("doctor", "--skip-agents", stdout=out)

    assert f"✓ data directory {loose_data_dir}: owner-only" in out.getvalue()


@pytest.mark.django_db
def test_health_warns_about_the_data_directory_and_what_lies_directly_in_it(
    api: Client, loose_data_dir: Path
) -> None:
    response = api.get("/api/health")

    assert response.status_code == 200  # a warning, as an unsandboxed agent is: still served
    report = response.json()["data_dir"]
    assert report["ok"] is False
    assert [line.split(":")[0] for line in report["warnings"]] == [
        "the data directory is 0755",
        f"{DB} is 0644",
    ]
    assert str(loose_data_dir) not in str(report)  # paths relative to it: users read this too

    loose_data_dir.chmod(0o700)
    (loose_data_dir / DB).chmod(0o600)
    assert api.get("/api/health").json()["data_dir"] == {"ok": True, "warnings": []}
