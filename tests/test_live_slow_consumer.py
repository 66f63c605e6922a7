"""A client that stops reading while a run streams (issue 23, "a slow consumer").

daphne hands each frame to Twisted at once; without a bound a socket whose client does not
read keeps every frame of the run in the web process. Here a real daphne streams ~60 MB to a
client that reads the first events and then stops (a 4 KiB receive buffer, a one-frame queue
in the client library): the web's RSS stays within a bound, the socket is closed with 4008
(runs.live.outflow), and a new socket subscribing from the stuck one's cursor gets exactly the
rest of the journal. docs/reliability.md has the figures; docs/live-delivery.md the design.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from runs import journal
from runs.models import JournalEvent, Run, RunStatus
from tests import factories
from tests.support.live import LiveStack, assert_contiguous, layer, live, session_cookie  # noqa: F401
from tests.support.procs import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

EVENTS = 20_000
BATCH = 200
PAYLOAD_CHARS = 3000  # ~60 MB of frames in all: far past any per-socket bound
STALL_SECONDS = 2.0  # HERMESWEB_SOCKET_STALL_SECONDS for this daphne (default 30)
# The web's growth while it streams to a client that does not read. Unbounded, it keeps every
# frame of the run (~60 MB: measured +63 MiB, never given back); bounded, one socket holds at
# most HERMESWEB_SOCKET_MAX_BACKLOG_BYTES (4 MiB) in Twisted and as much in its backlog, plus
# a replay page and the allocator's slack (measured +9 MiB). The feed's page is counted in events,
# not bytes: 5,000 of these (15 MB of text, more decoded) went past the bound on a quiet box
# where the appends outran the feed, so this daphne reads pages of PAGE_EVENTS (1.5 MB).
RSS_GROWTH_MAX = 30 * 1024 * 1024
PAGE_EVENTS = 500


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


class RssSampler:
    """The peak RSS of a process, sampled by a thread every 20 ms until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = rss_bytes(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.peak = max(self.peak, rss_bytes(self.pid))
            except (OSError, AssertionError):
                return  # the process ended

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.peak


def stuck_client(live: LiveStack, session_id: int, cookie: str) -> ClientConnection:
    """A WebSocket client whose TCP reading stops as soon as the test stops calling recv()."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window stays small
    sock.connect(("127.0.0.1", live.port))
    connection = connect(
        live.url(session_id),
        sock=sock,
        origin=live.origin(),  # type: ignore[arg-type]
        additional_headers={"Cookie": f"sessionid={cookie}"},
        proxy=None,
        compression=None,
        max_size=None,
        max_queue=1,  # the library's reader stops once one frame waits for recv()
        ping_interval=None,
        open_timeout=30,
    )
    return live.sockets.enter_context(connection)


def append_stream(run: Run, first: int, last: int) -> None:
    """Events first..last of the run, appended in batches as the runner's writer would."""
    filler = os.urandom(PAYLOAD_CHARS // 2).hex()
    for start in range(first, last + 1, BATCH):
        batch = [
            journal.NewEvent("token.delta", {"message_id": "m1", "delta": f"{n}:{filler}"})
            for n in range(start, min(start + BATCH, last + 1))
        ]
        journal.append_batch(run.pk, batch)


def read_events(ws: ClientConnection, run_id: int, through: int, timeout: float = 60) -> list[dict[str, Any]]:
    """Events of run_id read from ws until seq `through`."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while not got or got[-1]["seq"] < through:
        frame = orjson.loads(ws.recv(timeout=deadline - time.monotonic()))
        if frame["type"] == "event":
            got.append(frame["event"])
        elif frame["type"] == "events":
            got.extend(frame["events"])
    return [e for e in got if e["run_id"] == run_id]


def test_a_client_that_stops_reading_is_closed_with_4008_and_the_web_stays_bounded(live: LiveStack) -> None:
    live.start_daphne(
        HERMESWEB_SOCKET_STALL_SECONDS=str(STALL_SECONDS), HERMESWEB_EVENTS_PAGE_MAX=str(PAGE_EVENTS)
    )
    assert live.daphne is not None
    session = factories.SessionFactory()
    run = factories.RunFactory(session=session, status=RunStatus.RUNNING)
    cookie = session_cookie(session.project.owner)

    stuck = stuck_client(live, session.pk, cookie)
    stuck.send(orjson.dumps({"type": "subscribe", "after": {str(run.pk): 0}}).decode())
    append_stream(run, 1, BATCH)
    seen = read_events(stuck, run.pk, BATCH)  # the client reads the first batch, then stops
    assert_contiguous(seen, 1, BATCH)
    cursor = seen[-1]["seq"]

    rss_before = rss_bytes(live.daphne.pid)
    sampler = RssSampler(live.daphne.pid)
    started = time.monotonic()
    append_stream(run, BATCH + 1, EVENTS)
    journal.append_batch(run.pk, [journal.done_event("completed")])
    streamed = time.monotonic() - started
    try:
        closed_at: float | None = wait_for(
            lambda: "closing with 4008" in live.daphne.log() and time.monotonic(),  # type: ignore[union-attr]
            timeout=30,
        )
    except AssertionError:
        closed_at = None
    peak = sampler.stop()
    rss_after = rss_bytes(live.daphne.pid)
    growth = peak - rss_before
    closed = "not closed" if closed_at is None else f"closed 4008 {closed_at - started:.1f} s after it began"
    print(
        f"FIGURE slow consumer ({live.layer}): {EVENTS} events x {PAYLOAD_CHARS} chars streamed in "
        f"{streamed:.1f} s; web RSS {rss_before / 2**20:.0f} MiB before, peak {peak / 2**20:.0f} MiB "
        f"(+{growth / 2**20:.1f} MiB), {rss_after / 2**20:.0f} MiB after; {closed}"
    )
    assert growth < RSS_GROWTH_MAX, f"the web grew by {growth / 2**20:.0f} MiB for one stuck socket"
    assert closed_at is not None, "the web did not close the stuck socket with 4008"

    # The stuck client's connection is gone: reading again ends in a close, not in the run's end.
    with pytest.raises((ConnectionClosed, OSError)):
        while True:
            stuck.recv(timeout=30)

    # Resuming from its cursor gets exactly the rest of the journal.
    last = Run.objects.get(pk=run.pk).last_seq
    resumed = live.socket(session.pk, cookie)
    resumed.subscribe({run.pk: cursor})
    rest = resumed.events_to_terminal(run.pk, timeout=120)
    assert_contiguous(rest, cursor + 1, last)
    journal_seqs = list(JournalEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert [e["seq"] for e in seen + rest] == journal_seqs
    assert rest[-1]["type"] == "done"
