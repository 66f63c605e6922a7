"""A private redis-server for one test, on a free loopback port, that the test may kill and restart.

Never the machine's shared Redis (6379): this one is started here, killed by its own pid, and
started again on the same port, so clients that held connections must reconnect.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import time
from pathlib import Path

import redis

from tests.support.procs import free_port, wait_for


class RedisServer:
    def __init__(self, work_dir: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.dir = work_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed (apt-get install redis-server)"
        self.binary = binary

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1, socket_timeout=2)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> RedisServer:
        assert not self.alive()
        self.starts += 1
        log = open(self.dir / f"redis-{self.starts}.log", "wb")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.dir),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

        def answers() -> bool:
            if not self.alive():
                raise AssertionError(
                    f"redis-server exited: {(self.dir / f'redis-{self.starts}.log').read_text()}"
                )
            with contextlib.suppress(redis.RedisError), self.client() as client:
                return bool(client.ping())
            return False

        wait_for(answers, 20, what=f"redis-server on port {self.port}")
        return self

    def kill(self) -> float:
        """SIGKILL it (by its own pid); the time it died."""
        assert self.proc is not None and self.alive()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        return time.time()

    def stop(self) -> None:
        if self.alive():
            self.kill()
