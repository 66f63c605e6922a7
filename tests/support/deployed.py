"""Web and runner processes started the way deploy/systemd's units start them.

The units' `ExecStart=` lines are read from the unit files themselves, with `%i` filled in and
the installation directory (/srv/hermesweb/app) mapped to this checkout; both run
`deploy/commands.sh`, which `exec`s daphne or the runner, so the pid a test holds is the
server's own (SIGKILL hits it, not a shell).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import shlex
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runs.models import Runner
from tests.support import procs
from tests.support.viewers import Viewer

REPO = procs.REPO
DEPLOY = REPO / "deploy"
UNITS = DEPLOY / "systemd"
COMMANDS = DEPLOY / "commands.sh"
ENV_EXAMPLE = DEPLOY / "hermesweb.env.example"
NGINX_SITE = DEPLOY / "nginx" / "hermesweb.conf"
INSTALL_DIR = "/srv/hermesweb/app"
WEB_UNIT = "hermesweb-web@.service"
RUNNER_UNIT = "hermesweb-runner@.service"


def unit_directives(unit: str) -> dict[str, list[str]]:
    """`Key=value` lines of a unit file, by key (a key may repeat)."""
    found: dict[str, list[str]] = {}
    for line in (UNITS / unit).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        found.setdefault(key.strip(), []).append(value.strip())
    return found


def exec_start(unit: str, instance: str) -> list[str]:
    """The unit's ExecStart for `instance`, runnable from this checkout."""
    lines = unit_directives(unit)["ExecStart"]
    assert len(lines) == 1, f"{unit}: one ExecStart expected, got {lines}"
    line = lines[0].replace("%i", instance).replace("%%", "%")
    assert not re.search(r"%[a-zA-Z]", line), f"{unit}: unhandled specifier in {line!r}"
    argv = shlex.split(line)
    return [str(REPO) + arg[len(INSTALL_DIR) :] if arg.startswith(INSTALL_DIR) else arg for arg in argv]


def deployed_env(**extra: str) -> dict[str, str]:
    """The test's process environment plus what the units' environment file gives commands.sh."""
    return procs.process_env(
        HERMESWEB_PYTHON=sys.executable,
        HERMESWEB_APP_DIR=str(REPO),
        HERMESWEB_WEB_BIND="127.0.0.1",
        **extra,
    )


def start_web(
    log_dir: Path, env: dict[str, str], port: int | None = None, wait: bool = True
) -> tuple[procs.Proc, int]:
    """`hermesweb-web@PORT.service`'s command; with `wait`, returns once it accepts connections."""
    port = port or procs.free_port()
    proc = procs.Proc(f"web-{port}", exec_start(WEB_UNIT, str(port)), env, log_dir)
    if wait:
        wait_listening(proc, port)
    return proc, port


def wait_listening(proc: procs.Proc, port: int) -> None:
    def listening() -> bool:
        if not proc.alive():
            raise AssertionError(f"web process exited:\n{proc.log()}")
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    procs.wait_for(listening, 60, what=f"the web process on port {port} to listen")


def start_runner(log_dir: Path, env: dict[str, str], instance: str) -> procs.Proc:
    """`hermesweb-runner@INSTANCE.service`'s command (no --id: the runner names itself)."""
    return procs.Proc(f"runner-{instance}", exec_start(RUNNER_UNIT, instance), env, log_dir)


def runner_id(proc: procs.Proc, timeout: float = 60.0) -> str:
    """The id the runner registered under (host-pid-random), found by its pid."""

    def registered() -> str | None:
        if not proc.alive():
            raise AssertionError(f"runner exited:\n{proc.log()}")
        row = Runner.objects.filter(pid=proc.pid, stopped_at__isnull=True).order_by("-started_at").first()
        return row.id if row else None

    return str(procs.wait_for(registered, timeout, what=f"runner pid {proc.pid} to register"))


def shell_words(command: list[str]) -> str:
    return " ".join(shlex.quote(part) for part in command)


def health(port: int, cookie: str) -> tuple[int, dict[str, Any]]:
    """GET /api/health from one web process, signed in: (status, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    try:
        conn.request("GET", "/api/health", headers={"Cookie": f"sessionid={cookie}"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


@dataclass
class Stack:
    """The processes and viewers of one test; `close` stops them (by their pids) and the viewers."""

    log_dir: Path
    env: dict[str, str]
    procs: list[procs.Proc] = field(default_factory=list)
    viewers: list[Viewer] = field(default_factory=list)

    def web(self) -> int:
        return self.webs(1)[0]

    def webs(self, count: int) -> list[int]:
        """`count` web processes, started together; their ports once all listen."""
        started = [start_web(self.log_dir, self.env, wait=False) for _ in range(count)]
        self.procs.extend(proc for proc, _ in started)
        for proc, port in started:
            wait_listening(proc, port)
        return [port for _, port in started]

    def runner(self, instance: str, **env: str) -> procs.Proc:
        proc = start_runner(self.log_dir, {**self.env, **env}, instance)
        self.procs.append(proc)
        return proc

    def viewer(self, name: str, session: Any, cookie: str, port: int, wait: bool = True) -> Viewer:
        """A viewer subscribed to `session` on the web process at `port` (and, with `wait`, its
        snapshot received: from then on every new run of the session is followed)."""
        viewer = Viewer(name, session.pk, cookie)
        self.viewers.append(viewer)
        viewer.connect(port)
        if wait:
            viewer.wait_frame(lambda f: f["type"] == "session", what="the session snapshot")
        return viewer

    def logs(self) -> str:
        return "\n".join(f"===== {p.name} (pid {p.pid}) =====\n{p.log()[-5000:]}" for p in self.procs)

    def close(self) -> None:
        for viewer in self.viewers:
            with contextlib.suppress(Exception):
                viewer.disconnect()
        for proc in reversed(self.procs):
            proc.stop(timeout=20)
