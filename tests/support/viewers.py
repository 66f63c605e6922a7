"""Viewers: session sockets read by a thread of their own, each event stamped as it arrives.

A test with several viewers (or a viewer and a fault to inject) cannot read them in turn
without delaying some; here every socket is drained continuously, so arrival times are the
network's, and a test waits on what has arrived (a Condition), never on a sleep.

`Viewer` is one client that may move between web processes: each `connect` opens a new socket
(to any web process) resuming from the cursors of everything received so far, as the browser
does. `assert_matches_journal` holds what it received, deduped by (run_id, seq), to the journal.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from runs.models import JournalEvent

TIMEOUT = 60.0


@dataclass(frozen=True)
class Received:
    socket: int  # which of the viewer's sockets (0, 1, …)
    run_id: int
    seq: int
    type: str
    terminal: bool
    created_at: float  # the event's commit time (epoch seconds), from its envelope
    at: float  # when this client read it (epoch seconds)
    wire: str  # "event" or "events": the frame it came in
    payload: Any

    @property
    def latency(self) -> float:
        return self.at - self.created_at


@dataclass
class Viewer:
    """One client of one session; `connect` (again) to any web process resumes from its cursors."""

    name: str
    session_id: int
    cookie: str
    received: list[Received] = field(default_factory=list)
    frames: list[tuple[int, float, dict[str, Any]]] = field(default_factory=list)  # non-event frames
    closed: list[tuple[int, int | None]] = field(default_factory=list)  # (socket, close code)
    _ws: ClientConnection | None = None
    _exit: contextlib.ExitStack | None = None
    _reader: threading.Thread | None = None
    _sockets: int = 0
    _cond: threading.Condition = field(default_factory=threading.Condition)

    # ------------------------------------------------------------ connection

    def connect(self, port: int, cursors: dict[int, int] | None = None) -> None:
        """Open a socket to the web process on `port` and subscribe after `cursors` (default: what
        this viewer received so far, as the browser resumes)."""
        self.disconnect()
        after = self.cursors() if cursors is None else cursors
        origin = f"http://127.0.0.1:{port}"
        self._exit = contextlib.ExitStack()
        connection = connect(
            f"ws://127.0.0.1:{port}/ws/sessions/{self.session_id}/",
            origin=origin,  # type: ignore[arg-type]
            additional_headers={"Cookie": f"sessionid={self.cookie}"},
            proxy=None,
            open_timeout=30,
            max_size=None,
        )
        ws = self._exit.enter_context(connection)
        index = self._sockets
        self._sockets += 1
        self._ws = ws
        self._reader = threading.Thread(target=self._read, args=(ws, index), daemon=True, name=self.name)
        self._reader.start()
        self.send(type="subscribe", after={str(k): v for k, v in after.items()})

    def disconnect(self) -> None:
        exit_, self._exit, self._ws = self._exit, None, None
        if exit_ is not None:
            with contextlib.suppress(Exception):
                exit_.close()  # closes the socket
        if self._reader is not None:
            self._reader.join(10)
            self._reader = None

    def send(self, **message: Any) -> None:
        assert self._ws is not None, "not connected"
        self._ws.send(orjson.dumps(message).decode())

    def _read(self, ws: ClientConnection, index: int) -> None:
        while True:
            try:
                text = ws.recv()
            except ConnectionClosed as exc:
                with self._cond:
                    self.closed.append((index, exc.rcvd.code if exc.rcvd else None))
                    self._cond.notify_all()
                return
            except Exception:
                with self._cond:
                    self.closed.append((index, None))
                    self._cond.notify_all()
                return
            at = time.time()
            frame = orjson.loads(text)
            with self._cond:
                kind = frame.get("type")
                if kind in ("event", "events"):
                    envelopes = [frame["event"]] if kind == "event" else frame["events"]
                    for e in envelopes:
                        self.received.append(
                            Received(
                                index,
                                e["run_id"],
                                e["seq"],
                                e["type"],
                                e["terminal"],
                                float(e["created_at"]),
                                at,
                                kind,
                                e["payload"],
                            )
                        )
                else:
                    self.frames.append((index, at, frame))
                self._cond.notify_all()

    # ------------------------------------------------------------ waiting

    def wait(self, predicate: Callable[[Viewer], Any], timeout: float = TIMEOUT, what: str = "") -> Any:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                value = predicate(self)
                if value:
                    return value
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    tail = [(r.run_id, r.seq, r.type) for r in self.received[-5:]]
                    raise AssertionError(
                        f"{self.name}: timed out after {timeout}s waiting for {what or predicate}; "
                        f"last events {tail}, closed {self.closed}"
                    )
                self._cond.wait(min(remaining, 0.5))

    def wait_seq(self, run_id: int, seq: int, timeout: float = TIMEOUT) -> None:
        self.wait(lambda v: v.cursors().get(run_id, 0) >= seq, timeout, f"run {run_id} seq {seq}")

    def wait_terminal(self, run_id: int, timeout: float = TIMEOUT) -> None:
        self.wait(lambda v: v.has_terminal(run_id), timeout, f"the terminal event of run {run_id}")

    def wait_frame(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = TIMEOUT, what: str = ""
    ) -> dict[str, Any]:
        def find(v: Viewer) -> dict[str, Any] | None:
            return next((f for _, _, f in v.frames if predicate(f)), None)

        return self.wait(find, timeout, what)

    # ------------------------------------------------------------ what arrived

    def snapshot(self) -> list[Received]:
        with self._cond:
            return list(self.received)

    def cursors(self) -> dict[int, int]:
        """The highest seq received per run (what a resuming client sends)."""
        out: dict[int, int] = {}
        for r in self.received:
            out[r.run_id] = max(out.get(r.run_id, 0), r.seq)
        return out

    def has_terminal(self, run_id: int) -> bool:
        return any(r.terminal and r.run_id == run_id for r in self.received)

    def run_ids(self) -> set[int]:
        return {r.run_id for r in self.snapshot()}

    def duplicates_within_a_socket(self) -> list[tuple[int, int, int]]:
        """(socket, run, seq) sent twice on one socket: the server promises none."""
        seen: set[tuple[int, int, int]] = set()
        dups = []
        for r in self.snapshot():
            key = (r.socket, r.run_id, r.seq)
            if key in seen:
                dups.append(key)
            seen.add(key)
        return dups

    def deduped(self) -> dict[tuple[int, int], Received]:
        out: dict[tuple[int, int], Received] = {}
        for r in self.snapshot():
            out.setdefault((r.run_id, r.seq), r)
        return out


def journal_of(run_ids: Iterable[int]) -> dict[tuple[int, int], JournalEvent]:
    rows = JournalEvent.objects.filter(run_id__in=list(run_ids)).order_by("seq")
    return {(e.run_id, e.seq): e for e in rows}


@dataclass
class Comparison:
    checked: int  # journal events this viewer had to receive
    lost: list[tuple[int, int]]
    extra: list[tuple[int, int]]
    differing: list[tuple[int, int]]
    redelivered: int  # events received more than once across the viewer's sockets (client dedupes)


def compare(viewer: Viewer, run_ids: Iterable[int]) -> Comparison:
    """What the viewer received (deduped by (run_id, seq)) against the journal of `run_ids`."""
    run_ids = set(run_ids)
    journal = journal_of(run_ids)
    got = {key: r for key, r in viewer.deduped().items() if key[0] in run_ids}
    lost = sorted(set(journal) - set(got))
    extra = sorted(set(got) - set(journal))
    differing = sorted(
        key
        for key in set(journal) & set(got)
        if (journal[key].type, journal[key].terminal, journal[key].payload)
        != (got[key].type, got[key].terminal, got[key].payload)
    )
    total = sum(1 for r in viewer.snapshot() if r.run_id in run_ids)
    return Comparison(len(journal), lost, extra, differing, total - len(got))


def assert_matches_journal(viewer: Viewer, run_ids: Iterable[int]) -> Comparison:
    result = compare(viewer, run_ids)
    assert not viewer.duplicates_within_a_socket(), f"{viewer.name}: {viewer.duplicates_within_a_socket()}"
    assert not result.lost, f"{viewer.name} lost {result.lost[:20]} of {result.checked}"
    assert not result.extra, f"{viewer.name} got events not in the journal: {result.extra[:20]}"
    assert not result.differing, f"{viewer.name} got events unlike the journal's: {result.differing[:20]}"
    return result
