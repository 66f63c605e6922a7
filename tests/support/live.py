"""Live-delivery test helpers: real daphne and runner processes, a signed-in WebSocket client.

`layer` is parametrized: "embedded" (no REDIS_URL: InMemory layer, the socket
tails the database) and "redis" (pubsub layer on a prefix of the test's own).
Import the fixtures into a test module with
`from tests.support.live import layer, live  # noqa: F401`.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from django.test import Client
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from hermesweb.channel_layer import redis_channel_layer
from tests.support import procs

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
TIMEOUT = 60.0


def session_cookie(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


@pytest.fixture(
    params=[
        pytest.param("embedded", marks=pytest.mark.embedded),
        pytest.param("redis", marks=pytest.mark.redis),
    ]
)
def layer(request: pytest.FixtureRequest, settings: Any) -> str:
    """Configure this process's channel layer like the subprocesses' (see LiveStack.env)."""
    if request.param == "redis":
        settings.REDIS_URL = os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL
        settings.HERMESWEB_TEST_REDIS_PREFIX = f"hwtest-{uuid.uuid4().hex[:10]}"
        settings.CHANNEL_LAYERS = {
            "default": redis_channel_layer(
                settings.REDIS_URL, settings.HERMESWEB_TEST_REDIS_PREFIX, settings.SECRET_KEY
            )
        }
    else:
        settings.REDIS_URL = ""
        settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    return str(request.param)


@dataclass
class LiveStack:
    layer: str
    log_dir: Path
    settings: Any
    procs: list[procs.Proc] = field(default_factory=list)
    daphne: procs.Proc | None = None
    port: int = 0
    sockets: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def env(self, **extra: str) -> dict[str, str]:
        if self.layer == "redis":
            env = {
                "REDIS_URL": self.settings.REDIS_URL,
                "HERMESWEB_REDIS_PREFIX": self.settings.HERMESWEB_TEST_REDIS_PREFIX,
            }
        else:
            env = {"REDIS_URL": ""}
        return {**env, **extra}

    def start_daphne(self, **env: str) -> int:
        self.daphne, self.port = procs.start_daphne(self.log_dir, **self.env(**env))
        self.procs.append(self.daphne)
        return self.port

    def start_runner(self, **env: str) -> procs.Proc:
        runner = procs.start_runner(self.log_dir, f"live-{uuid.uuid4().hex[:6]}", **self.env(**env))
        self.procs.append(runner)
        return runner

    def url(self, session_id: int) -> str:
        return f"ws://127.0.0.1:{self.port}/ws/sessions/{session_id}/"

    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def socket(self, session_id: int, cookie: str | None, origin: str | None = "") -> LiveSocket:
        """A client socket; origin "" means this server's own origin, None sends no Origin header."""
        headers = {"Cookie": f"sessionid={cookie}"} if cookie else None
        ws = connect(
            self.url(session_id),
            origin=self.origin() if origin == "" else origin,  # type: ignore[arg-type]
            additional_headers=headers,
            proxy=None,
            open_timeout=30,
            max_size=None,
        )
        return LiveSocket(self.sockets.enter_context(ws))

    def logs(self) -> str:
        return "\n".join(f"===== {p.name} =====\n{p.log()[-6000:]}" for p in self.procs)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.sockets.close()
        for proc in reversed(self.procs):
            proc.stop(timeout=15)


@pytest.fixture
def live(layer: str, transactional_db: None, tmp_path: Path, settings: Any) -> Iterator[LiveStack]:
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    stack = LiveStack(layer, log_dir, settings)
    try:
        yield stack
    finally:
        stack.stop()
        # Shown by pytest only when the test failed.
        print(stack.logs())


class LiveSocket:
    """A synchronous WebSocket client that decodes frames and waits on them, never on sleeps."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.frames: list[dict[str, Any]] = []
        self.wire: list[str] = []  # the type of each frame as it came over the wire
        self._unpacked: deque[dict[str, Any]] = deque()

    def send(self, **message: Any) -> None:
        self.ws.send(orjson.dumps(message).decode())

    def subscribe(self, after: dict[int, int] | None = None) -> None:
        self.send(type="subscribe", after={str(k): v for k, v in (after or {}).items()})

    def recv(self, timeout: float = TIMEOUT) -> dict[str, Any]:
        """The next frame; a catch-up `events` frame comes out as its `event` frames, as browsers read it."""
        if not self._unpacked:
            frame = orjson.loads(self.ws.recv(timeout=timeout))
            self.wire.append(frame["type"])
            if frame["type"] == "events":
                assert frame["events"], "an events frame is never empty"
                assert all(e["run_id"] == frame["run_id"] for e in frame["events"])
                self._unpacked.extend({"type": "event", "event": e} for e in frame["events"])
            else:
                self._unpacked.append(frame)
        frame = self._unpacked.popleft()
        self.frames.append(frame)
        return frame

    def until(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = TIMEOUT
    ) -> list[dict[str, Any]]:
        """Frames received up to and including the first that satisfies `predicate`."""
        deadline = time.monotonic() + timeout
        seen: list[dict[str, Any]] = []
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no matching frame within {timeout}s; got {seen[-5:]}")
            try:
                frame = self.recv(remaining)
            except TimeoutError:
                raise AssertionError(f"no matching frame within {timeout}s; got {seen[-5:]}") from None
            seen.append(frame)
            if predicate(frame):
                return seen

    def session(self, timeout: float = TIMEOUT) -> dict[str, Any]:
        return self.until(lambda f: f["type"] == "session", timeout)[-1]["session"]

    def events_until(
        self, run_id: int, predicate: Callable[[dict[str, Any]], bool], timeout: float = TIMEOUT
    ) -> list[dict[str, Any]]:
        """Event envelopes of `run_id` up to the first that satisfies `predicate`."""

        def match(frame: dict[str, Any]) -> bool:
            return (
                frame["type"] == "event" and frame["event"]["run_id"] == run_id and predicate(frame["event"])
            )

        frames = self.until(match, timeout)
        return events_of(frames, run_id)

    def events_to_terminal(self, run_id: int, timeout: float = TIMEOUT) -> list[dict[str, Any]]:
        return self.events_until(run_id, lambda e: e["terminal"], timeout)

    def quiet(self, seconds: float) -> list[dict[str, Any]]:
        """Frames received within `seconds` (for asserting that nothing more arrives)."""
        deadline = time.monotonic() + seconds
        got: list[dict[str, Any]] = []
        while self._unpacked:
            got.append(self.recv())
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                got.append(self.recv(remaining))
            except TimeoutError:
                break
        return got

    def close_code(self, timeout: float = TIMEOUT) -> int | None:
        """Read until the server closes; the close code it sent."""
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                self.recv(deadline - time.monotonic())
        except ConnectionClosed as exc:
            return exc.rcvd.code if exc.rcvd else None
        raise AssertionError("the server did not close the socket")

    def close(self) -> None:
        self.ws.close()


def events_of(frames: list[dict[str, Any]], run_id: int) -> list[dict[str, Any]]:
    return [f["event"] for f in frames if f["type"] == "event" and f["event"]["run_id"] == run_id]


def seqs(events: list[dict[str, Any]]) -> list[int]:
    return [event["seq"] for event in events]


def assert_contiguous(events: list[dict[str, Any]], first: int, last: int | None = None) -> None:
    """Exactly once, in order: first, first+1, …, last."""
    got = seqs(events)
    end = got[-1] if last is None and got else (last or 0)
    assert got == list(range(first, end + 1)), f"expected seqs {first}..{end}, got {got}"
