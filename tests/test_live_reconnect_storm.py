"""A reconnect storm (issue 23): hundreds of sockets reconnect to one web process at once.

First with cursors that are all caught up, then with cursors far behind, while the run goes on
streaming: every socket gets exactly the journal after its cursor (nothing lost, nothing twice,
in order), `/api/health` keeps answering (polled throughout: its worst latency is the figure),
and the web's memory stays bounded (its peak RSS). Clients retry a failed handshake with
socket.js's backoff, as browsers do. docs/reliability.md has the figures.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import random
import threading
import time
from dataclasses import dataclass, field

import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidHandshake

from runs import journal
from runs.models import Run, RunStatus
from tests import factories
from tests.support.live import LiveStack, layer, live, session_cookie  # noqa: F401
from tests.test_live_slow_consumer import RssSampler, rss_bytes

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

# CI's size (~20-25 s on this 2-core box under load). The storm, 200 sockets 10k behind
# (HERMESWEB_STORM_SOCKETS=200 HERMESWEB_STORM_BEHIND=10000), passes too but takes ~1.5-2.5 min,
# so CI does not run it: since the consumer accepts before it reads the sign-in, no handshake
# waits on a query inside daphne's 5 s (docs/reliability.md, "reconnect storm").
SOCKETS = int(os.environ.get("HERMESWEB_STORM_SOCKETS", "50"))
BEHIND = int(os.environ.get("HERMESWEB_STORM_BEHIND", "2000"))
LIVE_EVENTS = 300  # streamed while the sockets reconnect and catch up
# /api/health's worst answer during a storm. On this 2-core box at load 11-21 (shared with
# other test runs) it was 2.7 s on SQLite and 6.3 s on PostgreSQL with Redis (50 sockets, 28
# handshakes retried): the bound says "answers", the figure in docs/reliability.md says how fast.
HEALTH_MAX_SECONDS = 10.0
RSS_GROWTH_MAX = 400 * 1024 * 1024
# static/js/socket.js's reconnect backoff: a storm is clients that try again.
BACKOFF_SECONDS = (0.5, 1.0, 2.0, 4.0, 8.0, 10.0)


@dataclass
class StormSocket:
    cursor: int
    seqs: list[int] = field(default_factory=list)
    terminal: bool = False
    retries: int = 0  # handshakes that failed (daphne's 5 s connect timeout) and were tried again
    ws: ClientConnection | None = None


class HealthPoller:
    """GET /api/health in a loop on its own thread: the worst latency and any failure."""

    def __init__(self, port: int, cookie: str) -> None:
        self.port, self.cookie = port, cookie
        self.worst = 0.0
        self.answers = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            try:
                conn.request("GET", "/api/health", headers={"Cookie": f"sessionid={self.cookie}"})
                response = conn.getresponse()
                response.read()
                if response.status != 200:
                    self.failures.append(f"status {response.status}")
            except OSError as exc:
                self.failures.append(repr(exc))
            finally:
                conn.close()
            self.worst = max(self.worst, time.monotonic() - started)
            self.answers += 1
            self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(35)


async def storm(
    live: LiveStack, session_id: int, cookie: str, run_id: int, cursors: list[int]
) -> list[StormSocket]:
    """Open one socket per cursor at once, each subscribing after its cursor; read until `until`."""
    sockets = [StormSocket(cursor) for cursor in cursors]

    async def open_one(s: StormSocket) -> None:
        for attempt in range(len(BACKOFF_SECONDS) + 1):
            try:
                s.ws = await connect(
                    live.url(session_id),
                    origin=live.origin(),  # type: ignore[arg-type]
                    additional_headers={"Cookie": f"sessionid={cookie}"},
                    proxy=None,
                    compression=None,
                    max_size=None,
                    open_timeout=60,
                    ping_interval=None,
                )
                break
            except (OSError, InvalidHandshake, EOFError):
                # As the browser's socket.js does: try again after a jittered backoff.
                if attempt == len(BACKOFF_SECONDS):
                    raise
                s.retries += 1
                await asyncio.sleep(BACKOFF_SECONDS[attempt] * random.uniform(0.75, 1.25))
        assert s.ws is not None
        await s.ws.send(orjson.dumps({"type": "subscribe", "after": {str(run_id): s.cursor}}).decode())

    await asyncio.gather(*(open_one(s) for s in sockets))
    return sockets


async def read_until(sockets: list[StormSocket], run_id: int, last: int, timeout: float) -> None:
    """Read every socket until it has `last` (or the run's terminal event)."""

    async def read(s: StormSocket) -> None:
        assert s.ws is not None
        while not (s.seqs and s.seqs[-1] >= last):
            frame = orjson.loads(await s.ws.recv())
            kind = frame["type"]
            events = [frame["event"]] if kind == "event" else frame["events"] if kind == "events" else []
            for e in events:
                if e["run_id"] == run_id:
                    s.seqs.append(e["seq"])
                    s.terminal = s.terminal or e["terminal"]

    await asyncio.wait_for(asyncio.gather(*(read(s) for s in sockets)), timeout)


def append(run: Run, count: int) -> None:
    for start in range(0, count, 500):
        batch = [
            journal.NewEvent("token.delta", {"message_id": "m1", "delta": f"word {start + n} "})
            for n in range(min(500, count - start))
        ]
        journal.append_batch(run.pk, batch)


def last_seq(run: Run) -> int:
    return Run.objects.values_list("last_seq", flat=True).get(pk=run.pk)


def check(sockets: list[StormSocket], last: int) -> int:
    """Each socket got exactly cursor+1..last, in order; the events checked."""
    for i, s in enumerate(sockets):
        assert s.seqs == list(range(s.cursor + 1, last + 1)), (
            f"socket {i} (cursor {s.cursor}): {len(s.seqs)} events, first {s.seqs[:3]}, last {s.seqs[-3:]}"
        )
    return sum(len(s.seqs) for s in sockets)


async def close_all(sockets: list[StormSocket]) -> None:
    await asyncio.gather(*(s.ws.close() for s in sockets if s.ws is not None), return_exceptions=True)


def test_a_storm_of_reconnects_catches_every_socket_up_exactly_and_health_keeps_answering(
    live: LiveStack,
) -> None:
    # One user's storm: past the per-user socket cap with HERMESWEB_STORM_SOCKETS=200, and a
    # retried handshake holds its row until its socket's close is handled.
    live.start_daphne(HERMESWEB_MAX_SOCKETS_PER_USER=str(4 * SOCKETS))
    assert live.daphne is not None
    session = factories.SessionFactory()
    run = factories.RunFactory(session=session, status=RunStatus.RUNNING)
    cookie = session_cookie(session.project.owner)
    append(run, BEHIND)
    health = HealthPoller(live.port, cookie)
    rss_before = rss_bytes(live.daphne.pid)
    sampler = RssSampler(live.daphne.pid)
    figures: list[str] = []

    async def phase(name: str, cursor: int, done: bool) -> None:
        started = time.monotonic()
        sockets = await storm(live, session.pk, cookie, run.pk, [cursor] * SOCKETS)
        opened = time.monotonic() - started
        # The run goes on meanwhile: the live tail arrives behind each socket's replay.
        await asyncio.to_thread(append, run, LIVE_EVENTS)
        if done:
            await asyncio.to_thread(journal.append_batch, run.pk, [journal.done_event("completed")])
        last = await asyncio.to_thread(last_seq, run)
        await read_until(sockets, run.pk, last, timeout=180)
        caught_up = time.monotonic() - started
        checked = check(sockets, last)
        if done:
            assert all(s.terminal for s in sockets)
        retries = sum(s.retries for s in sockets)
        figures.append(
            f"{name}: {SOCKETS} sockets opened in {opened:.1f} s ({retries} handshakes retried), "
            f"all caught up in {caught_up:.1f} s, "
            f"{checked} events checked, lost 0, duplicated 0"
        )
        await close_all(sockets)

    try:
        asyncio.run(phase("caught up", last_seq(run), done=False))
        asyncio.run(phase(f"{BEHIND} behind", last_seq(run) - BEHIND, done=False))
        asyncio.run(phase(f"{BEHIND} behind, run ends", last_seq(run) - BEHIND, done=True))
    finally:
        health.stop()
        peak = sampler.stop()
    print(
        f"FIGURE reconnect storm ({live.layer}): {'; '.join(figures)}; /api/health {health.answers} answers, "
        f"worst {health.worst:.2f} s, failures {len(health.failures)}; web RSS "
        f"{rss_before / 2**20:.0f} MiB before, peak {peak / 2**20:.0f} MiB "
        f"(+{(peak - rss_before) / 2**20:.0f} MiB)"
    )
    assert not health.failures, health.failures[:5]
    assert health.worst < HEALTH_MAX_SECONDS
    assert peak - rss_before < RSS_GROWTH_MAX
