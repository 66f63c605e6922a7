"""The long soak (issue 23): many sessions at once, each a random walk, then every promise checked.

Real processes: daphne (the web) and `manage.py runner` (two of each with `--scale`), the bundled
demo agent, PostgreSQL + Redis (or, with `--sqlite`, the embedded default: SQLite, no Redis).
Each session is a random walk for `--minutes`: turns with the demo agent's words (`slow`, `fast`,
`toolloop`, `think`, `tool`, or none), sent over the composer's socket or `POST …/messages`;
messages queued while a turn runs, steered (sent as steer, or a waiting item upgraded),
stop-and-sent, edited, moved and deleted (with the version the client saw); turns cancelled;
a submit sent again with its `client_id`. Each session has viewers (the walker's composer socket
among them) that drop their socket (cleanly or abruptly) and come back at random to any web
process: resuming from their cursors, from cursor 0 for every run they know, or as a fresh page.

At the deadline the walk stops producing; slow turns still running are cancelled (so the wait
is bounded) and every run and queued message must settle within `--settle-seconds`. Then:
- every run's journal is seq 1..last_seq without a gap, with exactly one terminal event, last;
- every message sent ran exactly once: a turn (its Run, with the text of its last accepted edit),
  a delivered steer (one `steer.delivered`), or a deletion the walk made; no run nobody sent;
- every socket sent each run's seqs in order from its cursor + 1, none twice, none skipped;
  every viewer's events (deduped by (run_id, seq)) are the journal's, and at the end it holds
  every run it saw and every run that started while its last socket was open, complete;
- no 5xx (HTTP, a refused submit's status, close code 1011, an `internal_error` frame);
- the web and runner processes' peak RSS.
Exit status 1 on any violation. Not part of bench/run (minutes long): bench/README.md, "The soak".

usage: python bench/soak.py [--minutes 3] [--sessions 12] [--seed N] [--sqlite] [--scale]
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import http.client
import json
import os
import random
import re
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _support as S
from bench import _ws

# The demo agent's trigger words (docs/demo-agent.md) and how often a turn uses each.
WORDS = {"fast": 4, "toolloop": 3, "think": 2, "tool": 2, "": 2, "slow": 1}
SESSIONS_PER_PROJECT = 6
MAX_OPEN_INTENTS = 4  # the walk keeps each queue short, so the settle stays bounded
SUBMIT_ANSWER_SECONDS = 8.0  # the composer's: no answer by then, send it again over HTTP
RECONNECT_FLAVORS = {"resume": 2, "zero": 1, "fresh": 1}


# ---------------------------------------------------------------- what the walk sent


@dataclass
class Message:
    """One message the walk sent (a new client_id), and what became of it as far as the client knows."""

    session_id: int
    client_id: str
    text: str  # the text of its last accepted edit
    mode: str
    via: str  # "socket" | "post"
    kind: str = ""  # the answer's kind: run | queue | steer | stop_and_send ("" until answered)
    run_id: int | None = None
    intent_id: int | None = None
    refused: str = ""  # the refusal's code
    deleted: bool = False  # the walk's delete of it was accepted


@dataclass
class Tally:
    """Everything counted across the soak: actions and their answers, and what went wrong."""

    actions: Counter[str] = field(default_factory=Counter)
    answers: Counter[str] = field(default_factory=Counter)
    http_errors: list[str] = field(default_factory=list)
    server_errors: list[str] = field(default_factory=list)  # 5xx and their kin
    violations: list[str] = field(default_factory=list)
    reconnects: Counter[str] = field(default_factory=Counter)
    handshake_retries: int = 0  # a handshake refused or timed out (daphne's 5 s on a busy box), tried again
    closes: Counter[str] = field(default_factory=Counter)
    frames: int = 0
    rss_peak: dict[str, float] = field(default_factory=dict)

    def violate(self, text: str) -> None:
        self.violations.append(text)


# ---------------------------------------------------------------- HTTP (a script's Bearer token)


class Api:
    """Blocking HTTP/1.1 keep-alive connections, one per web process, used by one walker at a time."""

    def __init__(self, ports: list[int], token: str, tally: Tally) -> None:
        self.ports = ports
        self.token = token
        self.tally = tally
        self.connections: dict[int, http.client.HTTPConnection] = {}

    def call(self, port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.token}"}
        data = None
        if body is not None:
            data = json.dumps(body)
            headers["Content-Type"] = "application/json"
        for attempt in (1, 2):
            conn = self.connections.get(port)
            if conn is None:
                conn = self.connections[port] = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            try:
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                raw = response.read()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                del self.connections[port]
                # A keep-alive connection the server closed meanwhile: once more on a new one.
                if attempt == 2:
                    self.tally.http_errors.append(f"{method} {path}: {exc!r}")
                    return 0, None
                continue
            template = "/".join("N" if part.isdigit() else part for part in path.split("?")[0].split("/"))
            self.tally.answers[f"{method} {template} {response.status}"] += 1
            if response.status >= 500:
                self.tally.server_errors.append(f"{method} {path} → {response.status}: {raw[:300]!r}")
            try:
                return response.status, json.loads(raw) if raw else None
            except ValueError:
                return response.status, None
        return 0, None


# ---------------------------------------------------------------- viewers


@dataclass
class SocketLog:
    """One socket of a view: where it resumed from, and the last seq it sent of each run."""

    index: int
    flavor: str  # first | resume | zero | fresh
    after: dict[int, int]
    opened_at: float
    snapshot_at: float | None = None
    closed_at: float | None = None
    close_code: int | None = None
    last: dict[int, int] = field(default_factory=dict)
    events: int = 0


@dataclass
class View:
    """What one page remembers across its sockets: every event deduped by (run_id, seq)."""

    name: str
    received: dict[tuple[int, int], tuple[str, bool, Any]] = field(default_factory=dict)
    sockets: list[SocketLog] = field(default_factory=list)
    redelivered: int = 0
    problems: list[str] = field(default_factory=list)

    def cursors(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for run_id, seq in self.received:
            out[run_id] = max(out.get(run_id, 0), seq)
        return out

    def runs(self) -> set[int]:
        return {run_id for run_id, _ in self.received}


class Viewer:
    """A browser tab on one session: one socket at a time, to any web process; a fresh page is a new View."""

    def __init__(self, name: str, session_id: int, cookie: str, tally: Tally) -> None:
        self.name = name
        self.session_id = session_id
        self.cookie = cookie
        self.tally = tally
        self.view = View(name)
        self.retired: list[View] = []
        self.client: _ws.WSClient | None = None
        self.socket: SocketLog | None = None
        self.snapshot: dict[str, Any] | None = None
        self.snapshot_at = 0.0
        self.pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        # The walk's churn and the watch for server closes both reconnect: one at a time.
        self.connecting = asyncio.Lock()

    @property
    def connected(self) -> bool:
        return self.client is not None and not self.client.closed.done() and self.socket is not None

    async def connect(self, port: int, flavor: str) -> None:
        async with self.connecting:
            self.disconnect()
            await self._connect(port, flavor)

    async def _connect(self, port: int, flavor: str) -> None:
        if flavor == "fresh":
            self.retired.append(self.view)
            self.view = View(f"{self.name}#{len(self.retired)}")
        if flavor == "zero":
            after = {run_id: 0 for run_id in self.view.runs()}
        elif flavor in ("resume", "first"):
            after = self.view.cursors()
        else:
            after = {}
        sock = SocketLog(len(self.view.sockets), flavor, after, time.time())
        for attempt in range(5):
            try:
                self.client = await _ws.connect(
                    port,
                    f"/ws/sessions/{self.session_id}/",
                    self._on_frame_of(sock),
                    cookie=self.cookie,
                    origin=f"http://127.0.0.1:{port}",
                )
                break
            except (OSError, _ws.Handshake, TimeoutError) as exc:
                self.tally.handshake_retries += 1
                if attempt == 4:
                    self.tally.violate(f"{self.name}: could not open a socket to :{port}: {exc!r}")
                    return
                await asyncio.sleep(0.2 * (attempt + 1))
        self.socket = sock
        self.view.sockets.append(sock)
        self.client.send_json({"type": "subscribe", "after": {str(k): v for k, v in after.items()}})
        self.tally.reconnects[flavor] += 1

    def disconnect(self, abrupt: bool = False) -> None:
        client, sock = self.client, self.socket
        self.client, self.socket = None, None
        if sock is not None and sock.closed_at is None:
            sock.closed_at = time.time()
        if client is not None:
            if client.closed.done():
                self._note_close(client)
            elif abrupt and client.transport is not None:
                client.transport.abort()  # no close frame: a dropped network, as the server sees it
            else:
                client.close()
        for future in self.pending.values():
            if not future.done():
                future.cancel()
        self.pending.clear()

    def _note_close(self, client: _ws.WSClient) -> None:
        code = client.closed.result()
        self.tally.closes[str(code)] += 1
        if code == 1011:
            self.tally.server_errors.append(f"{self.name}: socket closed by the server with 1011")

    def server_closed(self) -> bool:
        """The server closed our socket (a code, or the connection lost): noted, and we are disconnected."""
        if self.client is not None and self.client.closed.done():
            self.disconnect()
            return True
        return False

    def _on_frame_of(self, sock: SocketLog) -> _ws.OnFrame:
        def on_frame(payload: bytes, _now: float) -> None:
            self.tally.frames += 1
            message = orjson.loads(payload)
            kind = message.get("type")
            if kind == "session":
                if sock.snapshot_at is None:
                    sock.snapshot_at = time.time()
                self.snapshot, self.snapshot_at = message["session"], time.monotonic()
            elif kind == "submitted":
                future = self.pending.pop(str(message.get("client_id")), None)
                if future is not None and not future.done():
                    future.set_result(message)
            elif kind == "error":
                self.tally.answers[f"socket error {message.get('code')}"] += 1
                if message.get("code") == "internal_error":
                    self.tally.server_errors.append(f"{self.name}: error frame {message}")
            for envelope in _ws.envelopes(message):
                self._event(sock, envelope)

        return on_frame

    def _event(self, sock: SocketLog, e: dict[str, Any]) -> None:
        run_id, seq = int(e["run_id"]), int(e["seq"])
        sock.events += 1
        if e.get("session_id") != self.session_id:
            self.view.problems.append(f"socket {sock.index}: run {run_id} of session {e.get('session_id')}")
        last = sock.last.get(run_id)
        expected = (last if last is not None else sock.after.get(run_id, 0)) + 1
        if seq < expected:
            self.view.problems.append(
                f"socket {sock.index}: run {run_id} seq {seq} again (expected {expected})"
            )
        elif seq > expected:
            self.view.problems.append(
                f"socket {sock.index}: run {run_id} seq {seq} after {expected - 1}: seqs skipped"
            )
        sock.last[run_id] = max(last or 0, seq)
        key = (run_id, seq)
        if key in self.view.received:
            self.view.redelivered += 1
        else:
            self.view.received[key] = (e["type"], bool(e["terminal"]), e["payload"])

    async def submit(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """A submit frame on this socket; its `submitted` answer, or None (closed, or no answer in time)."""
        if not self.connected or self.client is None:
            return None
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[message["client_id"]] = future
        self.client.send_json({"type": "submit", **message})
        try:
            return await asyncio.wait_for(future, SUBMIT_ANSWER_SECONDS)
        except (TimeoutError, asyncio.CancelledError):
            return None


# ---------------------------------------------------------------- one session's walk


@dataclass
class Soak:
    ports: list[int]
    cookie: str
    token: str
    rng: random.Random
    deadline: float
    tally: Tally = field(default_factory=Tally)
    messages: dict[str, Message] = field(default_factory=dict)
    viewers: dict[int, list[Viewer]] = field(default_factory=dict)
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(32, "soak-http"))

    async def http(self, api: Api, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        port = self.rng.choice(self.ports)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, api.call, port, method, path, body)

    def state(self, session_id: int) -> tuple[int | None, list[dict[str, Any]]]:
        """The active run and the open intents, from the session's freshest snapshot (any of its tabs)."""
        best = max(self.viewers[session_id], key=lambda v: v.snapshot_at)
        snapshot = best.snapshot or {}
        return snapshot.get("active_run_id"), list(snapshot.get("intents") or [])

    async def walk(self, session_id: int) -> None:
        api = Api(self.ports, self.token, self.tally)
        rng = random.Random(self.rng.random())
        sent: list[Message] = []
        n = 0
        while time.monotonic() < self.deadline:
            await asyncio.sleep(rng.uniform(0.05, 0.9))
            active, intents = self.state(session_id)
            waiting = [i for i in intents if i.get("state") == "waiting" and i.get("kind") == "queue"]
            choices: dict[str, float] = {"duplicate": 0.3 if sent else 0.0}
            if len(intents) < MAX_OPEN_INTENTS:
                choices["send"] = 3.0 if active else 5.0
            if active:
                choices["cancel"] = 0.5
            if waiting:
                choices.update(edit=1.0, delete=0.6)
                if active:
                    choices.update(steer=0.8, stop_and_send=0.6)
            if len(waiting) >= 2:
                choices["move"] = 1.0
            names = [k for k, w in choices.items() if w > 0]
            action = rng.choices(names, [choices[k] for k in names])[0]
            self.tally.actions[action] += 1
            if action == "send":
                n += 1
                word = rng.choices(list(WORDS), list(WORDS.values()))[0]
                mode = rng.choices(["queue", "steer", "auto"], [6, 3, 1])[0] if active else "auto"
                text = f"{word} soak s{session_id} m{n}".strip()
                message = Message(session_id, uuid.uuid4().hex, text, mode, rng.choice(["socket", "post"]))
                self.messages[message.client_id] = message
                sent.append(message)
                await self.send(api, message)
            elif action == "duplicate":
                message = rng.choice(sent)
                await self.send(api, message, again=True)
            elif action == "cancel":
                await self.http(api, "POST", f"/api/runs/{active}/cancel")
            else:
                item = rng.choice(waiting)
                await self.act_on(api, action, item, active, rng, len(waiting))

    async def send(self, api: Api, message: Message, again: bool = False) -> None:
        body = {"client_id": message.client_id, "text": message.text, "mode": message.mode}
        answer: dict[str, Any] | None = None
        if message.via == "socket" and not again:
            composer = self.viewers[message.session_id][0]
            was_connected = composer.connected
            frame = await composer.submit(body)
            if frame is not None and "error" in frame:
                error = frame["error"]
                if int(error.get("status", 0)) >= 500:
                    self.tally.server_errors.append(f"submit {message.client_id}: {error}")
                self.tally.answers[f"socket submit refused {error.get('code')}"] += 1
                if error.get("code") not in ("database_unavailable", "not_authenticated"):
                    message.refused = str(error.get("code"))
                    return
            elif frame is not None:
                answer = frame["result"]
                self.tally.answers["socket submit answered"] += 1
            elif not was_connected:
                self.tally.actions["socket submit sent over HTTP (composer offline)"] += 1
            elif composer.connected:
                # Connected all along and no answer: worth a look, though the HTTP resend is the contract.
                self.tally.actions["socket submit unanswered in 8 s, resent over HTTP"] += 1
            else:
                self.tally.actions["socket submit cut by a reconnect, resent over HTTP"] += 1
        if answer is None:
            status, data = await self.http(api, "POST", f"/api/sessions/{message.session_id}/messages", body)
            if status != 202:
                if not message.kind:
                    message.refused = str((data or {}).get("code", status))
                return
            answer = data
        assert answer is not None
        if again and message.kind and not answer.get("duplicate"):
            self.tally.violate(f"message {message.client_id} sent again was not a duplicate: {answer}")
        if not message.kind or not again:
            message.kind = answer["kind"]
            message.run_id = answer.get("run_id") or message.run_id
            message.intent_id = answer.get("intent_id") or message.intent_id
            message.refused = ""

    async def act_on(
        self, api: Api, action: str, item: dict[str, Any], active: int | None, rng: random.Random, count: int
    ) -> None:
        intent_id, version = item["id"], item["version"]
        message = next((m for m in self.messages.values() if m.intent_id == intent_id), None)
        if action == "edit":
            text = f"{item['text'].split(' edited')[0]} edited{rng.randrange(1000)}"
            status, data = await self.http(
                api, "PATCH", f"/api/intents/{intent_id}", {"version": version, "text": text}
            )
            if status == 200 and data and data.get("status") == "accepted" and message is not None:
                message.text = text
        elif action == "move":
            body = {"version": version, "position": rng.randrange(count)}
            await self.http(api, "PATCH", f"/api/intents/{intent_id}", body)
        elif action == "delete":
            status, data = await self.http(api, "DELETE", f"/api/intents/{intent_id}?version={version}")
            if status == 200 and data and data.get("status") == "accepted" and message is not None:
                message.deleted = True
        elif action == "steer":
            await self.http(api, "POST", f"/api/intents/{intent_id}/steer", {"run_id": active})
        elif action == "stop_and_send":
            await self.http(api, "POST", f"/api/intents/{intent_id}/stop-and-send", {"run_id": active})

    # ------------------------------------------------------------ viewers coming and going

    async def churn(self, viewer: Viewer, mean_gap: float) -> None:
        rng = random.Random(self.rng.random())
        await viewer.connect(rng.choice(self.ports), "first")
        while time.monotonic() < self.deadline:
            gap = max(0.3, rng.expovariate(1 / mean_gap))
            await asyncio.sleep(min(gap, max(0.0, self.deadline - time.monotonic())))
            if time.monotonic() >= self.deadline:
                break
            if not viewer.server_closed():
                viewer.disconnect(abrupt=rng.random() < 0.3)
            await asyncio.sleep(rng.uniform(0, 2.0))
            flavor = rng.choices(list(RECONNECT_FLAVORS), list(RECONNECT_FLAVORS.values()))[0]
            await viewer.connect(rng.choice(self.ports), flavor)
        # After the deadline each tab stays (or comes back) on one socket until the end.
        if viewer.server_closed() or not viewer.connected:
            await viewer.connect(rng.choice(self.ports), "resume")

    async def watch_closes(self, stop: asyncio.Event) -> None:
        """A socket the server closed: its tab reconnects from its cursors, as the browser does."""
        while not stop.is_set():
            for viewers in self.viewers.values():
                for viewer in viewers:
                    if viewer.server_closed():
                        await viewer.connect(self.rng.choice(self.ports), "resume")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)


# ---------------------------------------------------------------- processes and RSS


async def sample_rss(procs: dict[str, list[int]], tally: Tally, stop: asyncio.Event) -> None:
    while not stop.is_set():
        groups = {**procs, "agents": [p for r in procs["runner"] for p in S.descendants(r)]}
        for name, pids in groups.items():
            each = max((S.rss_or_zero(p) for p in pids), default=0.0)
            total = sum(S.rss_or_zero(p) for p in pids)
            tally.rss_peak[name] = max(tally.rss_peak.get(name, 0.0), each)
            tally.rss_peak[f"{name} total"] = max(tally.rss_peak.get(f"{name} total", 0.0), total)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


# ---------------------------------------------------------------- database reads (sync)


def open_work(session_ids: list[int]) -> tuple[list[tuple[int, int, str, str]], int]:
    """(run, session, status, prompt) of the active runs, and how many intents are still open."""
    from intents.models import PendingIntent
    from runs.models import Run

    runs = list(
        Run.objects.filter(session_id__in=session_ids)
        .active()
        .values_list("pk", "session_id", "status", "prompt_text")
    )
    return runs, PendingIntent.objects.filter(session_id__in=session_ids).open().count()


def run_times(session_ids: list[int]) -> dict[int, tuple[int, float]]:
    """Each run's session and creation time (epoch seconds, the same clock as the sockets' stamps)."""
    from runs.models import Run

    rows = Run.objects.filter(session_id__in=session_ids).values_list("pk", "session_id", "created_at")
    return {pk: (session_id, created.timestamp()) for pk, session_id, created in rows}


def last_seqs(session_ids: list[int]) -> dict[int, int]:
    from runs.models import Run

    return dict(Run.objects.filter(session_id__in=session_ids).values_list("pk", "last_seq"))


async def settle(soak: Soak, session_ids: list[int], seconds: float) -> float:
    """Wait (bounded) until no run is active and no message waits; slow turns are cancelled to bound it."""
    loop = asyncio.get_running_loop()
    start = time.monotonic()
    api = Api(soak.ports, soak.token, soak.tally)
    cancelled: set[int] = set()
    while True:
        runs, open_intents = await loop.run_in_executor(soak.pool, open_work, session_ids)
        if not runs and not open_intents:
            return time.monotonic() - start
        if time.monotonic() - start > seconds:
            soak.tally.violate(
                f"not settled after {seconds:g} s: {len(runs)} runs active {runs[:5]}, "
                f"{open_intents} intents open"
            )
            return time.monotonic() - start
        for run_id, _, status, prompt in runs:
            if prompt.startswith("slow") and run_id not in cancelled and status != "cancelling":
                cancelled.add(run_id)
                soak.tally.actions["cancel (settling)"] += 1
                await soak.http(api, "POST", f"/api/runs/{run_id}/cancel")
        await asyncio.sleep(0.25)


async def caught_up(soak: Soak, session_ids: list[int], seconds: float) -> None:
    """Wait (bounded) until every tab's last socket holds, complete, every run it owes."""
    loop = asyncio.get_running_loop()
    lasts = await loop.run_in_executor(soak.pool, last_seqs, session_ids)
    created = await loop.run_in_executor(soak.pool, run_times, session_ids)
    deadline = time.monotonic() + seconds

    def missing(viewer: Viewer) -> list[int]:
        owed = owed_runs(viewer, created)
        return [
            r for r in owed if any((r, s) not in viewer.view.received for s in range(1, lasts.get(r, 0) + 1))
        ]

    while time.monotonic() < deadline:
        if not any(missing(v) for vs in soak.viewers.values() for v in vs):
            return
        await asyncio.sleep(0.1)


def owed_runs(viewer: Viewer, created: dict[int, tuple[int, float]]) -> set[int]:
    """Runs the tab must hold complete: those it has events of, and those its last socket saw begin.

    A run created after the socket's first snapshot has an id above the session's newest run at
    subscribe time, so the socket follows it from seq 0 (docs/live-delivery.md).
    """
    owed = viewer.view.runs()
    sock = viewer.socket
    if sock is not None and sock.snapshot_at is not None:
        owed |= {r for r, (sid, at) in created.items() if sid == viewer.session_id and at > sock.snapshot_at}
    return owed


# ---------------------------------------------------------------- the checks


@dataclass
class Figures:
    runs: int = 0
    events: int = 0
    events_checked: int = 0
    lost: int = 0  # seqs missing from a tab's final view
    gaps: int = 0  # a socket that skipped seqs (its tab may have them from another socket)
    duplicated: int = 0
    redelivered: int = 0
    sockets: int = 0
    views: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)


def check_all(soak: Soak, session_ids: list[int]) -> Figures:
    from intents.models import PendingIntent
    from runs.models import TERMINAL_STATUSES, JournalEvent, Run

    tally, figures = soak.tally, Figures()
    runs = {r.pk: r for r in Run.objects.filter(session_id__in=session_ids)}
    figures.runs = len(runs)
    journal: dict[tuple[int, int], tuple[str, bool, Any]] = {}
    for run_id, seq, kind, terminal, payload in (
        JournalEvent.objects.filter(run__session_id__in=session_ids)
        .values_list("run_id", "seq", "type", "terminal", "payload")
        .iterator(chunk_size=5000)
    ):
        journal[(run_id, seq)] = (kind, terminal, payload)
    figures.events = len(journal)

    # 1. Each run's journal: 1..last_seq, one terminal event, the last one.
    seqs: dict[int, list[int]] = {}
    terminals: dict[int, list[int]] = {}
    for (run_id, seq), (_, terminal, _) in journal.items():
        seqs.setdefault(run_id, []).append(seq)
        if terminal:
            terminals.setdefault(run_id, []).append(seq)
    for run in runs.values():
        got = sorted(seqs.get(run.pk, []))
        if got != list(range(1, run.last_seq + 1)):
            tally.violate(
                f"run {run.pk}: seqs {got[:3]}…{got[-3:]} (n={len(got)}) but last_seq {run.last_seq}"
            )
        ends = terminals.get(run.pk, [])
        if ends != [run.last_seq] or run.status not in TERMINAL_STATUSES:
            tally.violate(f"run {run.pk} ({run.status}): terminal events at {ends}, last_seq {run.last_seq}")

    # 2. Every message ran exactly once (or was deleted, or was delivered as steer).
    intents = {i.client_id: i for i in PendingIntent.objects.filter(session_id__in=session_ids)}
    by_client: dict[tuple[int, str], list[Run]] = {}
    for run in runs.values():
        by_client.setdefault((run.session_id, run.client_id), []).append(run)
    steers = Counter(
        payload.get("intent_id") for (kind, _, payload) in journal.values() if kind == "steer.delivered"
    )
    for intent_id, count in steers.items():
        if count != 1:
            tally.violate(f"intent {intent_id}: steer.delivered {count} times")
    for message in soak.messages.values():
        ran = by_client.get((message.session_id, message.client_id), [])
        intent = intents.get(message.client_id)
        if len(ran) > 1:
            tally.violate(f"message {message.client_id} ran {len(ran)} times")
        if intent is None:
            outcome = (
                "turn"
                if ran
                else "refused"
                if message.refused
                else "unanswered"
                if not message.kind
                else "lost"
            )
            if outcome == "lost":
                tally.violate(
                    f"message {message.client_id} ({message.text!r}) answered {message.kind!r}: no run"
                )
        elif intent.state == "dispatched":
            outcome = f"queued → ran ({intent.source or 'queue'}, {intent.kind})"
            if len(ran) != 1 or intent.run_id != ran[0].pk:
                tally.violate(
                    f"intent {intent.pk} dispatched to {intent.run_id} but runs {[r.pk for r in ran]}"
                )
            elif ran[0].prompt_text != message.text:
                tally.violate(
                    f"intent {intent.pk} ran {ran[0].prompt_text!r}, last edited to {message.text!r}"
                )
        elif intent.state == "delivered":
            outcome = "steer delivered"
            if ran or steers.get(intent.pk) != 1:
                tally.violate(
                    f"intent {intent.pk} delivered: runs {len(ran)}, steer events {steers.get(intent.pk)}"
                )
        elif intent.state == "deleted":
            outcome = "deleted"
            if ran or not message.deleted:
                tally.violate(f"intent {intent.pk} deleted (by the walk: {message.deleted}), runs {len(ran)}")
        else:
            outcome = f"left {intent.state}"
            tally.violate(f"intent {intent.pk} ({intent.kind}) still {intent.state} after settling")
        figures.outcomes[outcome] += 1
    known = {(m.session_id, m.client_id) for m in soak.messages.values()}
    for key, ran in by_client.items():
        if key not in known:
            tally.violate(f"run {[r.pk for r in ran]} with client_id {key[1]} that nobody sent")

    # 3. Every socket's stream and every tab's view, against the journal.
    created = {pk: (run.session_id, run.created_at.timestamp()) for pk, run in runs.items()}
    for viewers in soak.viewers.values():
        for viewer in viewers:
            final = viewer.view
            for view in [*viewer.retired, final]:
                figures.views += 1
                figures.sockets += len(view.sockets)
                figures.redelivered += view.redelivered
                for problem in view.problems:
                    figures.duplicated += " again " in problem
                    figures.gaps += "skipped" in problem
                    tally.violate(f"{view.name}: {problem}")
                for key, got in view.received.items():
                    figures.events_checked += 1
                    if key not in journal:
                        tally.violate(f"{view.name}: {key} is not in the journal")
                    elif journal[key] != got:
                        tally.violate(f"{view.name}: {key} differs from the journal: {got!r:.200}")
            for run_id in owed_runs(viewer, created):
                last = runs[run_id].last_seq if run_id in runs else 0
                holes = [s for s in range(1, last + 1) if (run_id, s) not in final.received]
                if holes:
                    figures.lost += len(holes)
                    tally.violate(f"{final.name}: run {run_id} lacks seqs {holes[:10]} of 1..{last}")
    return figures


def log_tracebacks(log_dir: Path) -> list[str]:
    """Each process log's tracebacks, told by the line logged before each and the exception that ended it.

    Not violations by themselves (a logged, handled error is allowed), but worth reading: the soak
    found a deadlock this way.
    """
    found = []
    for path in sorted(log_dir.glob("*.log")):
        lines = path.read_text(errors="replace").splitlines()
        kinds: Counter[str] = Counter()
        for i, line in enumerate(lines):
            before = next((t for t in reversed(lines[:i]) if t.strip()), "")[:160]
            # Counted by kind: the time stamp and the session's id differ from one to the next.
            told = re.sub(r"\d+", "N", before.split(" ", 2)[-1])
            if not line.startswith("Traceback") or before.startswith(("The above", "During")):
                continue  # a chained exception's second traceback: the first one tells it
            end = next(
                (
                    t
                    for t in lines[i + 1 :]
                    if t and not t.startswith((" ", "Traceback", "The above", "During"))
                ),
                "?",
            )
            kinds[f"{told} → {end[:200]}"] += 1
        found += [f"{path.name.rsplit('-', 1)[0]}: {n} x {kind}" for kind, n in kinds.items()]
    return found


# ---------------------------------------------------------------- main


def attach(url: str, *, redis: bool) -> S.BenchEnv:
    """S.setup for a database that exists and is migrated: nothing created, migrated or dropped.

    The smoke test (tests/test_soak_smoke.py) hands over its own test database: a migrate of a
    new one was most of its time.
    """
    data_dir = Path(tempfile.mkdtemp(prefix="hermesweb-bench-soak-"))
    (data_dir / "projects").mkdir()
    bench = S.BenchEnv(db="postgres", redis=redis, data_dir=data_dir)
    env = {
        "DJANGO_SETTINGS_MODULE": "hermesweb.settings",
        "DATABASE_URL": url,
        "HERMESWEB_DATA_DIR": str(data_dir),
        "HERMESWEB_ALLOWED_ROOTS": str(data_dir / "projects"),
        "SECRET_KEY": S.SECRET_KEY,
        "HERMESWEB_LOG_LEVEL": "WARNING",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(S.REPO), os.environ.get("PYTHONPATH", "")) if p),
    }
    os.environ.pop("REDIS_URL", None)
    if redis:
        bench.redis_prefix = f"hwsoak-{uuid.uuid4().hex[:8]}"
        env.update(REDIS_URL=S.REDIS_URL, HERMESWEB_REDIS_PREFIX=bench.redis_prefix)
    os.environ.update(env)
    bench.env = dict(os.environ)
    atexit.register(bench.cleanup)
    S.django_for_child()
    return bench


async def drive(
    soak: Soak, session_ids: list[int], procs: dict[str, list[int]], viewers_per_session: int, settle_s: float
) -> tuple[float, float]:
    stop = asyncio.Event()
    rss = asyncio.create_task(sample_rss(procs, soak.tally, stop))
    for sid in session_ids:
        soak.viewers[sid] = [
            Viewer(f"s{sid}v{i}", sid, soak.cookie, soak.tally) for i in range(viewers_per_session)
        ]
    # The composer's tab (viewer 0) is steadier than the others: a user rarely reloads mid-sentence.
    churners = [
        asyncio.create_task(soak.churn(v, 15.0 if i == 0 else 5.0))
        for vs in soak.viewers.values()
        for i, v in enumerate(vs)
    ]
    closes = asyncio.create_task(soak.watch_closes(stop))
    walkers = [asyncio.create_task(soak.walk(sid)) for sid in session_ids]
    await asyncio.gather(*walkers)
    S.log("soak: the walk stopped producing; settling")
    await asyncio.gather(*churners)
    settled = await settle(soak, session_ids, settle_s)
    S.log(f"soak: settled in {settled:.1f} s; waiting for the viewers")
    start = time.monotonic()
    await caught_up(soak, session_ids, 60.0)
    caught = time.monotonic() - start
    stop.set()
    await asyncio.gather(rss, closes)
    for vs in soak.viewers.values():
        for v in vs:
            v.server_closed()
    return settled, caught


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=3.0, help="how long the walk produces (3)")
    parser.add_argument("--sessions", type=int, default=12, help="sessions walking at once (12)")
    parser.add_argument(
        "--seed", type=int, default=None, help="the random walk's seed (printed; random by default)"
    )
    parser.add_argument("--sqlite", action="store_true", help="the embedded default: SQLite, no Redis")
    parser.add_argument("--scale", action="store_true", help="two web processes and two runners")
    parser.add_argument(
        "--viewers", type=int, default=2, help="tabs per session, the composer's included (2)"
    )
    parser.add_argument(
        "--database-url",
        help="an existing, migrated PostgreSQL database to use instead of a new one (the smoke test's own)",
    )
    parser.add_argument(
        "--settle-seconds", type=float, default=120.0, help="bound on the wait after the walk"
    )
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    db = "sqlite" if args.sqlite else "postgres"
    layer = "SQLite, no Redis" if args.sqlite else "PostgreSQL + Redis"
    count = 2 if args.scale else 1
    S.log(
        f"soak: {args.minutes:g} min, {args.sessions} sessions, seed {seed}, {layer}, "
        f"{count} web + {count} runner"
    )
    if args.database_url:
        bench = attach(args.database_url, redis=not args.sqlite)
    else:
        bench = S.setup(db, redis=not args.sqlite, name="soak")
    from hermesweb.models import ApiToken

    owner = S.make_owner()
    cookie = S.session_cookie(owner)
    _, token = ApiToken.issue(owner, name="soak")
    session_ids: list[int] = []
    project: Any = None
    for i in range(args.sessions):
        if i % SESSIONS_PER_PROJECT == 0:
            project = S.make_project(owner, name="soak")
        session_ids.append(S.make_session(owner, project=project).pk)
    log_dir = bench.data_dir / "logs"
    log_dir.mkdir(exist_ok=True)
    webs: list[S.Proc] = []
    runners: list[S.Proc] = []
    ports: list[int] = []
    started = time.monotonic()
    try:
        # Runners first: they start while daphne comes up (start_daphne waits for it to listen).
        runners = [S.start_runner(bench.env, log_dir, runner_id=f"soak-{i}") for i in range(count)]
        for i in range(count):
            proc, port = S.start_daphne("hermesweb.asgi:application", bench.env, log_dir, name=f"daphne-{i}")
            webs.append(proc)
            ports.append(port)
        S.log("soak: processes up; walking")
        procs = {"web": [w.pid for w in webs], "runner": [r.pid for r in runners]}
        soak = Soak(ports, cookie, token, random.Random(seed), time.monotonic() + args.minutes * 60)
        settled, caught = asyncio.run(drive(soak, session_ids, procs, args.viewers, args.settle_seconds))
        dead = [p.name for p in [*webs, *runners] if not p.alive()]
        if dead:
            soak.tally.violate(f"processes exited during the soak: {dead}")
    finally:
        # SIGTERM to all at once: a runner drains for a second or so, and they need not queue for it.
        for proc in [*runners, *webs]:
            proc.signal(signal.SIGTERM)
        for proc in [*runners, *webs]:
            proc.stop()
    wall = time.monotonic() - started
    figures = check_all(soak, session_ids)
    tally = soak.tally
    tracebacks = log_tracebacks(log_dir)
    report(args, seed, layer, count, figures, tally, settled, caught, wall, tracebacks)
    soak.pool.shutdown(wait=False)
    sys.exit(1 if tally.violations or tally.server_errors else 0)


def report(
    args: argparse.Namespace,
    seed: int,
    layer: str,
    count: int,
    figures: Figures,
    tally: Tally,
    settled: float,
    caught: float,
    wall: float,
    tracebacks: list[str],
) -> None:
    messages = sum(figures.outcomes.values())
    intent_actions = sum(
        tally.actions[k] for k in ("edit", "move", "delete", "steer", "stop_and_send", "cancel")
    )
    print(
        f"soak: {args.minutes:g} min, {args.sessions} sessions x {args.viewers} tabs, seed {seed}, {layer}, "
        f"{count} web + {count} runner; settled {settled:.1f} s after the walk, viewers caught up in "
        f"{caught:.1f} s; {wall:.0f} s in all"
    )
    print("actions: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.actions.items())))
    print("messages: " + ", ".join(f"{k} {v}" for k, v in sorted(figures.outcomes.items())))
    print("answers: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.answers.items())))
    print(
        "sockets: "
        + ", ".join(f"opened {k} {v}" for k, v in sorted(tally.reconnects.items()))
        + f"; handshakes retried {tally.handshake_retries}; closed by the server: "
        + (", ".join(f"{k} {v}" for k, v in sorted(tally.closes.items())) or "none")
    )
    rss = tally.rss_peak
    print(
        f"peak RSS: web {rss.get('web', 0):.0f} MiB (all {rss.get('web total', 0):.0f}), runner "
        f"{rss.get('runner', 0):.0f} MiB (all {rss.get('runner total', 0):.0f}), agents in all "
        f"{rss.get('agents total', 0):.0f} MiB"
    )
    if tally.http_errors:
        print(f"HTTP errors (no answer): {len(tally.http_errors)}, the first: {tally.http_errors[0]}")
    for text in tracebacks:
        print(f"log: {text}")
    for text in tally.server_errors[:20]:
        print(f"5xx: {text}")
    for text in tally.violations[:50]:
        print(f"VIOLATION: {text}")
    if len(tally.violations) > 50:
        print(f"… and {len(tally.violations) - 50} more violations")
    print(
        f"FIGURE soak ({layer}, {count}+{count}, {args.minutes:g} min, {args.sessions} sessions, "
        f"seed {seed}): "
        f"{figures.runs} turns, {figures.events} journal events, {figures.events_checked} events checked "
        f"over {figures.views} views / {figures.sockets} sockets, lost {figures.lost}, socket gaps "
        f"{figures.gaps}, duplicated "
        f"{figures.duplicated} (redelivered across sockets, deduped: {figures.redelivered}); "
        f"{len(tally.violations)} violations, 5xx {len(tally.server_errors)}; messages sent "
        f"{messages}, intent actions {intent_actions}; reconnects {sum(tally.reconnects.values())}; "
        f"peak RSS web {rss.get('web', 0):.0f} MiB, runner {rss.get('runner', 0):.0f} MiB"
    )


if __name__ == "__main__":
    main()
