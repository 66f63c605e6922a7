"""Live delivery of a session's journal and state to WebSocket subscribers.

Design note: docs/live-delivery.md. In each web process one `SessionFeed` per
session joins the channel-layer group `session.{id}` (one subscription per
process, not per socket), and the process's `LiveHub` tails the database for
all its feeds in one batched poll: every 0.1 s without Redis, where the
runner's notifications cannot reach us, every 2 s with it, as a safety net.
The feed broadcasts contiguous, pre-encoded event frames and
session snapshots to its `Subscription`s, one per socket. A subscription joins
the feed first, then replays the journal after its cursors in bounded pages,
then forwards the feed's frames, dropping any `(run_id, seq)` at or below what
it already sent for that run and reading gaps from the database. Seqs are only
ever compared within one run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import pydantic
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.db.models import Count, Max, Q

from hermesweb.auth import socket_sign_in, socket_user_now
from hermesweb.env import env_float
from hermesweb.errors import database_unavailable_body, validation_details
from intents.models import PendingIntent
from intents.services import intent_dict
from projects.models import Session
from runs import journal, notify, services
from runs.models import ACTIVE_STATUSES, TERMINAL_STATUSES, EventType, Run
from runs.schemas import MessageIn, SubmitOut

log = logging.getLogger(__name__)

MAX_MESSAGE_CHARS = 64 * 1024
MAX_CURSORS = 1000
# A subscriber this far behind its feed stops queueing and re-reads the database instead.
SUBSCRIBER_BACKLOG_MAX = 2000
# Likewise a feed this far behind the journal notifications it was handed.
INBOX_MAX = 2000
WAKE_COALESCE_SECONDS = 0.025
# Events that may change the session snapshot (active run status, title).
STATE_EVENTS = frozenset({EventType.RUN_STARTED, EventType.STATUS, EventType.DONE, EventType.TITLE_UPDATED})
_TERMINAL = frozenset(s.value for s in TERMINAL_STATUSES)


def tuning(name: str, default: float) -> float:
    """A timing knob: the Django setting if defined, else the environment variable of that name."""
    value = getattr(settings, name, None)
    if value is not None:
        return float(value)
    return env_float(name, default, minimum=0.001)


def heartbeat_seconds() -> float:
    return tuning("HERMESWEB_LIVE_HEARTBEAT_SECONDS", 15.0)


def poll_seconds(doorbell_crosses_processes: bool) -> float:
    if doorbell_crosses_processes:
        return tuning("HERMESWEB_LIVE_SAFETY_POLL_SECONDS", 2.0)
    # The InMemory layer cannot carry the runner's notifications: latency comes from this poll.
    return tuning("HERMESWEB_LIVE_POLL_SECONDS", 0.1)


# ---------------------------------------------------------------- frames


def encode(frame: dict[str, Any]) -> str:
    return orjson.dumps(frame).decode()


EVENT_FRAME_HEAD = '{"type":"event","event":'


def event_frame(envelope: dict[str, Any]) -> str:
    return f"{EVENT_FRAME_HEAD}{orjson.dumps(envelope).decode()}}}"


def envelope_text(frame: str) -> str:
    """The envelope's JSON inside an event frame (every Frame's text is one)."""
    return frame[len(EVENT_FRAME_HEAD) : -1]


def error_frame(code: str, message: str, **extra: Any) -> str:
    return encode({"type": "error", "code": code, "message": message, **extra})


PONG = encode({"type": "pong"})
HEARTBEAT = encode({"type": "heartbeat"})


class BadRequest(Exception):
    code = "bad_request"


@dataclass(frozen=True)
class Subscribe:
    after: dict[int, int]


@dataclass(frozen=True)
class Ping:
    pass


@dataclass(frozen=True)
class Submit:
    """A message from the composer, as `POST /api/sessions/{id}/messages` takes it (MessageIn)."""

    message: MessageIn


class InvalidSubmit(BadRequest):
    """A submit frame whose message is invalid: answered as that message's refusal."""

    code = "validation_error"

    def __init__(self, client_id: str | None, message: str, details: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.client_id = client_id
        self.details = details


def parse_client_message(text: str | None) -> Subscribe | Ping | Submit:
    """Validate one client frame; raises BadRequest with a message for the client."""
    if text is None:
        raise BadRequest("frames must be JSON text, not binary")
    if len(text) > MAX_MESSAGE_CHARS:
        raise BadRequest(f"frame longer than {MAX_MESSAGE_CHARS} characters")
    try:
        message = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise BadRequest("frame is not valid JSON") from None
    if not isinstance(message, dict):
        raise BadRequest("frame must be a JSON object")
    kind = message.get("type")
    if kind == "ping":
        return Ping()
    if kind == "submit":
        return _parse_submit(message)
    if kind != "subscribe":
        raise BadRequest(f"unknown message type {kind!r}; expected 'subscribe', 'submit' or 'ping'")
    after = message.get("after")
    if after is None:
        after = {}
    if not isinstance(after, dict):
        raise BadRequest("'after' must be an object of run id → seq")
    if len(after) > MAX_CURSORS:
        raise BadRequest(f"at most {MAX_CURSORS} cursors")
    cursors: dict[int, int] = {}
    for key, seq in after.items():
        if not (key.isascii() and key.isdigit() and len(key) <= 18):
            raise BadRequest(f"run id {key!r} in 'after' is not a positive integer")
        if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < 2**53:
            raise BadRequest(f"cursor for run {key} must be an integer seq ≥ 0")
        cursors[int(key)] = seq
    return Subscribe(cursors)


def _parse_submit(message: dict[str, Any]) -> Submit:
    fields = {key: value for key, value in message.items() if key != "type"}
    try:
        return Submit(MessageIn.model_validate(fields))
    except pydantic.ValidationError as exc:
        client_id = fields.get("client_id")
        if not isinstance(client_id, str) or not 1 <= len(client_id) <= 100:
            # No id to answer to: the frame itself is malformed.
            raise BadRequest("a submit needs a 'client_id' of 1 to 100 characters") from None
        # Located as the POST's would be: in the body.
        errors = [{**error, "loc": ("body", "payload", *error["loc"])} for error in exc.errors()]
        details = validation_details(errors)
        fields_text = ", ".join(sorted({detail["field"] for detail in details}))
        raise InvalidSubmit(client_id, f"Invalid input: {fields_text}.", details) from None


def submitted_frame(client_id: str, result: SubmitOut) -> str:
    return encode({"type": "submitted", "client_id": client_id, "result": result.model_dump()})


def refused_frame(client_id: str, status: int, code: str, message: str, **extra: Any) -> str:
    """The submit's answer when it is refused: `status` is the HTTP status the POST would have had."""
    error = {"status": status, "code": code, "message": message, **extra}
    return encode({"type": "submitted", "client_id": client_id, "error": error})


def answer_submit(scope: dict[str, Any], session_id: int, submit: Submit) -> tuple[str, bool]:
    """A socket's submit, done as the POST does it; its `submitted` frame (sync: a thread's).

    The composer sends over the socket it already holds: no HTTP request, no second
    authentication of a new connection (bench/README.md, round six). The flag says the
    socket's sign-in is gone: the caller closes it with 4401 after sending the frame.
    """
    try:
        return _answer_submit(scope, session_id, submit)
    except (OperationalError, InterfaceError) as exc:
        # As the API's 503: the client's retry carries the same client id, so it is never a second turn.
        log.warning("session %s: a socket submit found the database unavailable: %s", session_id, exc)
        body = database_unavailable_body()
        return refused_frame(submit.message.client_id, 503, **body), False


def _answer_submit(scope: dict[str, Any], session_id: int, submit: Submit) -> tuple[str, bool]:
    message = submit.message
    client_id = message.client_id
    signed_out = refused_frame(client_id, 401, "not_authenticated", "Signed out: sign in again to send.")
    # The sign-in is checked in the statement that writes where it can be (StillSignedIn).
    guard = socket_sign_in(scope)
    user = scope["user"] if guard is not None else socket_user_now(scope)
    if user is None:
        return signed_out, True
    try:
        result = services.do_submit_message_as(
            user,
            session_id,
            client_id=client_id,
            text=message.text,
            mode=message.mode,
            attachments=message.attachments,
            guard=guard,
        )
    except services.GuardFailed:
        return signed_out, True
    except Session.DoesNotExist:
        return refused_frame(client_id, 404, "not_found", "No such session."), False
    except services.SubmitRefused as exc:
        return refused_frame(client_id, exc.status, exc.code, exc.message), False
    return submitted_frame(client_id, SubmitOut.from_result(result)), False


# ---------------------------------------------------------------- database reads (sync)


def can_view(user: Any, session_id: int) -> bool:
    return Session.objects.visible_to(user).filter(pk=session_id).exists()


def run_floor(session_id: int) -> int:
    """The session's newest run id: runs above it started later (ids grow under the session lock)."""
    return Run.objects.filter(session_id=session_id).aggregate(top=Max("pk"))["top"] or 0


def session_snapshot(session_id: int) -> dict[str, Any] | None:
    session = Session.objects.select_related("project").filter(pk=session_id).first()
    if session is None:
        return None
    active = Run.objects.filter(session_id=session_id).active().values_list("pk", "status").first()
    intents = PendingIntent.objects.filter(session_id=session_id).open().order_by("position", "id")
    return {
        "session_id": session.pk,
        "status": session.status,
        "active_run_id": active[0] if active else None,
        "active_run_status": active[1] if active else None,
        "title": session.title,
        "commands": session.commands,
        "intents": [intent_dict(intent) for intent in intents],
        "agent": session.project.agent,
        "running_default": session.project.running_default,
    }


@dataclass(frozen=True)
class RunHead:
    run_id: int
    last_seq: int
    status: str

    @property
    def terminal(self) -> bool:
        return self.status in _TERMINAL


def run_heads(session_id: int, run_ids: Collection[int] = (), above: int | None = None) -> list[RunHead]:
    """The session's active runs, plus `run_ids`, plus runs newer than `above`."""
    return runs_heads({session_id: (run_ids, above)})[session_id]


# Sessions per query of a batched poll: each adds a term to one OR (SQLite's expression depth).
POLL_CHUNK = 200


def runs_heads(wanted: Mapping[int, tuple[Collection[int], int | None]]) -> dict[int, list[RunHead]]:
    """`run_heads` for many sessions (session id → (run ids, above)) in one query per chunk."""
    heads: dict[int, list[RunHead]] = {session_id: [] for session_id in wanted}
    items = list(wanted.items())
    for start in range(0, len(items), POLL_CHUNK):
        chunk = items[start : start + POLL_CHUNK]
        condition = Q(status__in=ACTIVE_STATUSES) | Q(pk__in=[pk for _, (ids, _) in chunk for pk in ids])
        for session_id, (_, above) in chunk:
            if above is not None:
                condition |= Q(session_id=session_id, pk__gt=above)
        rows = (
            Run.objects.filter(session_id__in=[session_id for session_id, _ in chunk])
            .filter(condition)
            .order_by("pk")
            .values_list("session_id", "pk", "last_seq", "status")
        )
        for session_id, pk, last_seq, status in rows:
            heads[session_id].append(RunHead(pk, last_seq, status))
    return heads


Marker = tuple[Any, ...]


def session_marker(session_id: int, heads: list[RunHead] | None = None) -> Marker | None:
    """Cheap fingerprint of the snapshot; title and commands are written without bumping updated_at."""
    if heads is None:
        heads = run_heads(session_id)
    return session_markers({session_id: heads})[session_id]


def session_markers(heads: Mapping[int, list[RunHead]]) -> dict[int, Marker | None]:
    """`session_marker` for many sessions (their heads given), in two queries per chunk."""
    markers: dict[int, Marker | None] = dict.fromkeys(heads)
    ids = list(heads)
    for start in range(0, len(ids), POLL_CHUNK):
        chunk = ids[start : start + POLL_CHUNK]
        rows = Session.objects.filter(pk__in=chunk).values_list(
            "pk", "updated_at", "title", "status", "commands", "project__updated_at"
        )
        intents = {
            session_id: (at, n)
            for session_id, at, n in PendingIntent.objects.filter(session_id__in=chunk)
            .order_by()
            .values("session_id")
            .annotate(at=Max("updated_at"), n=Count("pk"))
            .values_list("session_id", "at", "n")
        }
        for session_id, *row in rows:
            active = next(((h.run_id, h.status) for h in heads[session_id] if not h.terminal), None)
            markers[session_id] = (*row, *intents.get(session_id, (None, 0)), active)
    return markers


PollState = tuple[list[RunHead], Marker | None]


def poll_states(wanted: Mapping[int, tuple[Collection[int], int | None]]) -> dict[int, PollState]:
    """Heads and marker of many sessions at once: the process-wide safety poll's reads."""
    heads = runs_heads(wanted)
    markers = session_markers(heads)
    return {session_id: (heads[session_id], markers[session_id]) for session_id in wanted}


def feed_start_state(session_id: int) -> tuple[int, list[RunHead], Marker | None]:
    # The floor first: a run created after this read has a higher id, so the feed follows it.
    floor = run_floor(session_id)
    heads, marker = poll_states({session_id: ((), floor)})[session_id]
    return floor, heads, marker


Frame = tuple[int, bool, str]  # (seq, terminal, the encoded event frame)


def read_page(run_id: int, after_seq: int, upto: int | None = None) -> journal.EncodedPage:
    """Envelopes of one run with after_seq < seq ≤ upto, one bounded page; CursorAhead/CursorExpired."""
    run = Run.objects.only("pk", "session_id", "status", "last_seq", "compacted_through").get(pk=run_id)
    return journal.read_encoded(run, after_seq, upto=upto)


# The envelopes are JSON text already (journal.read_encoded): wrapping them is all the encoding a
# frame needs.
def event_frames(page: journal.EncodedPage) -> list[Frame]:
    return [(seq, terminal, f"{EVENT_FRAME_HEAD}{text}}}") for seq, terminal, text in page.rows]


# daphne's WebSocket library refuses to send a message over 1 MiB (and closes the socket):
# a catch-up frame stays under a quarter of that in characters, so under 1 MiB in UTF-8.
CATCHUP_FRAME_CHARS = 256 * 1024


def events_frames(run_id: int, rows: list[tuple[int, bool, str]]) -> Iterator[Frame]:
    """Catch-up in few frames: a frame per event costs more than the event (docs/live-delivery.md).

    Yields (last seq, terminal, frame) for `events` frames of consecutive envelopes; an
    envelope too big to share a frame gets one of its own.
    """
    start, size = 0, 0
    for i, (_, _, text) in enumerate(rows):
        if i > start and size + len(text) > CATCHUP_FRAME_CHARS:
            yield _events_frame(run_id, rows[start:i])
            start, size = i, 0
        size += len(text) + 1
    if start < len(rows):
        yield _events_frame(run_id, rows[start:])


def _events_frame(run_id: int, rows: list[tuple[int, bool, str]]) -> Frame:
    body = ",".join(text for _, _, text in rows)
    seq, terminal, _ = rows[-1]
    return seq, terminal, f'{{"type":"events","run_id":{run_id},"events":[{body}]}}'


@dataclass
class Plan:
    """What a subscribe resolves to: runs to replay (run id → cursor), errors to send, the run floor."""

    cursors: dict[int, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    refused: set[int] = field(default_factory=set)
    floor: int = 0


def plan_subscription(session_id: int, after: dict[int, int], floor_before: int) -> Plan:
    """Resolve the client's cursors against the journal.

    Cursored runs are followed from their cursor, ended or not, so a replay
    reaches their terminal event. The active run, and any run started since
    `floor_before` (read before the subscriber joined its feed), are followed
    from seq 0 unless a cursor says otherwise.
    """
    plan = Plan(floor=run_floor(session_id))
    runs = {
        run.pk: run
        for run in Run.objects.filter(session_id=session_id)
        .filter(Q(pk__in=list(after)) | Q(status__in=ACTIVE_STATUSES) | Q(pk__gt=floor_before))
        .only("pk", "last_seq", "compacted_through", "status")
    }
    for run_id, seq in after.items():
        run = runs.get(run_id)
        if run is None:
            plan.refused.add(run_id)
            plan.errors.append(
                error_frame("bad_request", f"run {run_id} is not a run of this session", run_id=run_id)
            )
            continue
        try:
            journal.check_cursor(run, seq)
        except journal.JournalError as exc:
            plan.refused.add(run_id)
            plan.errors.append(error_frame(exc.code, str(exc), run_id=run_id, last_seq=run.last_seq))
            continue
        plan.cursors[run_id] = seq
    for run_id, run in runs.items():
        if run_id not in after and (run.is_active or run_id > floor_before):
            plan.cursors[run_id] = 0
    return plan


# ---------------------------------------------------------------- the per-process feed

# Items a feed pushes to subscribers:
#   ("events", run_id, [(seq, terminal, frame), …]) — contiguous, ascending
#   ("session", generation, frame)
#   ("gone",)
Item = tuple[Any, ...]


class SessionGone(Exception):
    pass


class SessionFeed:
    """One session's live source in this process: one group membership, one poll, many sockets."""

    def __init__(self, session_id: int) -> None:
        self.session_id = session_id
        self.subscribers: set[Subscription] = set()
        self.heads: dict[int, int] = {}  # run id → highest seq broadcast
        self.watched: set[int] = set()  # runs still to be polled although no longer active
        # Run id → (a last_seq the database had that this feed had not broadcast, loop time first
        # seen): with a doorbell across processes a gap is repaired only once it outlived a poll
        # interval; younger ones are usually notifications on their way (see _still_in_flight).
        self.gaps: dict[int, tuple[int, float]] = {}
        self.floor = 0  # runs up to this id that were not active at start are not followed
        self.newest = 0  # the poll also looks for runs above this id
        self.marker: tuple[Any, ...] | None = None
        self.generation = 0
        self.snapshot_frame: str | None = None
        self.lock = asyncio.Lock()  # events go out in journal order, one batch at a time
        # Snapshot reads one at a time, so a slow read never overwrites a newer one.
        self.snapshot_lock = asyncio.Lock()
        self.changes = 0  # notifications that may have changed the snapshot, so far
        self.wake = asyncio.Event()
        self.layer = get_channel_layer()
        self.channel: str | None = None
        self.crosses_processes = bool(settings.REDIS_URL)
        self.started = False
        # The runner's notifications for this session, from the hub's one journal channel.
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        # Join the group before reading the database: whatever commits after the read rings here.
        if self.layer is not None:
            try:
                self.channel = await self.layer.new_channel()
                await self.layer.group_add(notify.session_group(self.session_id), self.channel)
            except Exception:
                log.warning(
                    "session %s: channel layer unavailable, polling only", self.session_id, exc_info=True
                )
                self.channel = None
        self.floor, heads, self.marker = await database_sync_to_async(feed_start_state)(self.session_id)
        self.newest = max([self.floor, *(head.run_id for head in heads)])
        self.heads = {head.run_id: head.last_seq for head in heads}
        self.watched = set(self.heads)
        self.started = True
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._wake_loop()))
        self._tasks.append(loop.create_task(self._inbox_loop()))
        if self.channel is not None:
            self._tasks.append(loop.create_task(self._listen_loop()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self.layer is not None and self.channel is not None:
            with contextlib.suppress(Exception):
                await self.layer.group_discard(notify.session_group(self.session_id), self.channel)

    # -------------------------------------------------------------- sources

    def poll_interval(self) -> float:
        return poll_seconds(self.crosses_processes and self.channel is not None)

    def poll_request(self) -> tuple[set[int], int]:
        """What the hub's safety poll reads for this feed: (runs still watched, newest run id)."""
        return set(self.watched), self.newest

    async def _wake_loop(self) -> None:
        # Doorbells that may change the snapshot; the periodic safety poll is the hub's.
        while True:
            await self.wake.wait()
            # A turn's start rings several (the submit, run.started, a title): one read for
            # them all, after the runner has claimed and prompted rather than beside it
            # (bench/README.md, ttft). Events never wait for this: they come inline.
            await asyncio.sleep(WAKE_COALESCE_SECONDS)
            self.wake.clear()
            try:
                await self.check()
            except Exception:
                log.exception("session %s: live check failed", self.session_id)
                await asyncio.sleep(1.0)

    def post(self, message: dict[str, Any]) -> None:
        """A journal notification from the hub; queued until this feed's start has read the database."""
        if self.inbox.qsize() >= INBOX_MAX:
            self.wake.set()  # far behind: the check reads what the dropped ones announced
            return
        self.inbox.put_nowait(message)

    async def _inbox_loop(self) -> None:
        while True:
            message = await self.inbox.get()
            try:
                await self.on_message(message)
            except Exception:
                log.exception("session %s: cannot handle a journal notification", self.session_id)

    async def _listen_loop(self) -> None:
        assert self.layer is not None and self.channel is not None
        while True:
            message = await self.layer.receive(self.channel)
            try:
                await self.on_message(message)
            except Exception:
                log.exception("session %s: cannot handle channel-layer message", self.session_id)

    async def on_message(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "run.events":
            events = message.get("events")
            async with self.lock:
                await self._advance(int(message["run_id"]), int(message["last_seq"]), events or [])
            if events is None or any(e.get("type") in STATE_EVENTS for e in events):
                self._changed()
        elif kind == "session.changed":
            self._changed()

    def _changed(self) -> None:
        self.changes += 1
        self.wake.set()

    async def check(self, state: PollState | None = None) -> None:
        """Broadcast what the doorbell missed and any change of the snapshot.

        The database is read outside the lock: events keep flowing meanwhile. (Held, the
        reads a turn's start sets off made its first tokens wait ~5 ms behind them:
        bench/README.md, ttft.) `state` may be older than something this feed did since,
        as when the hub's poll read it: an older head or marker only costs a redundant read.
        """
        if state is None:
            state = (await database_sync_to_async(poll_states)({self.session_id: self.poll_request()}))[
                self.session_id
            ]
        heads, marker = state
        end_in_flight = False
        async with self.lock:
            for head in heads:
                if self._still_in_flight(head):
                    # A snapshot that shows the run ended goes out after its `done`, not before.
                    end_in_flight = end_in_flight or head.terminal
                    continue
                if await self._advance(head.run_id, head.last_seq, []):
                    # Read from the database, so perhaps state events: a snapshot read meanwhile
                    # is stale. This check reads its own after (no wake: without Redis every
                    # poll reads events, and a check per poll would double the polling).
                    self.changes += 1
                if head.terminal and self.heads.get(head.run_id) == head.last_seq:
                    self.watched.discard(head.run_id)
        if marker is None:
            self._broadcast(("gone",))
        elif marker != self.marker and not end_in_flight:
            await self._refresh_snapshot(marker)

    def _still_in_flight(self, head: RunHead) -> bool:
        """Whether the events between what this feed broadcast and `head` may still be coming.

        With the doorbell across processes, a poll nearly always finds the last few commits'
        notifications in flight (Redis, the web's journal channel, the feed's inbox). Read
        at once, every streaming run cost a page read per poll for events the notification
        then brought again, and the read waited its turn on the web's one database thread
        while holding the feed's lock, with that feed's live events waiting behind it: the
        viewers' p99 with 100 runs streaming was ~1.2 s on a slow box (bench/README.md,
        round five). Only a gap still open a poll interval after it was first seen is read
        from the database. Without the doorbell the poll is the delivery: no grace.
        """
        if not (self.crosses_processes and self.channel is not None):
            return False
        have = self.heads.get(head.run_id)
        if have is not None and have >= head.last_seq:
            self.gaps.pop(head.run_id, None)
            return False
        now = asyncio.get_running_loop().time()
        seen = self.gaps.get(head.run_id)
        if seen is not None and (have or 0) < seen[0] and now - seen[1] >= self.poll_interval():
            del self.gaps[head.run_id]
            return False  # the notifications for what was missing then never came
        if seen is None or (have or 0) >= seen[0]:
            self.gaps[head.run_id] = (head.last_seq, now)
        return True

    async def _refresh_snapshot(self, marker: Marker) -> None:
        """Read the snapshot and broadcast it if it changed, unless the session changed meanwhile.

        A snapshot read before an event that changed it (a run's `done`, say) must not reach
        sockets after that event: it is dropped, and read again by the next check.
        """
        async with self.snapshot_lock:
            changes = self.changes
            snapshot = await database_sync_to_async(session_snapshot)(self.session_id)
            async with self.lock:
                if changes != self.changes:
                    self.wake.set()  # usually set already; read it again soon in any case
                    return
                self.marker = marker
                self._publish_snapshot(snapshot)

    # -------------------------------------------------------------- under the lock

    async def _advance(self, run_id: int, last_seq: int, inline: list[dict[str, Any]]) -> bool:
        """Broadcast run_id's events up to last_seq: inline ones if contiguous, else from the database.

        True if it read the database.
        """
        read = False
        high = self.heads.get(run_id)
        if high is None:
            if run_id <= self.floor:
                return False  # it ended before this feed started; subscribers replay it themselves
            high = 0  # a run that started since: follow it from its first event
            self.watched.add(run_id)
            self.newest = max(self.newest, run_id)
        fresh = [envelope for envelope in inline if envelope["seq"] > high]
        if fresh and fresh[0]["seq"] == high + 1:
            await self._broadcast_events(run_id, fresh)
            high = fresh[-1]["seq"]
        target = max(last_seq, fresh[-1]["seq"] if fresh else 0)
        while high < target:
            try:
                page = await database_sync_to_async(read_page)(run_id, high, target)
            except (journal.JournalError, Run.DoesNotExist):
                # Compacted or deleted: each subscriber meets the same answer when it repairs the gap.
                log.warning("session %s: cannot read run %s after seq %s", self.session_id, run_id, high)
                high = target
                break
            if not page.rows:
                break
            read = True
            await self._fan_out(run_id, event_frames(page))
            high = page.rows[-1][0]
        self.heads[run_id] = high
        return read

    def _publish_snapshot(self, snapshot: dict[str, Any] | None) -> None:
        if snapshot is None:
            self._broadcast(("gone",))
            return
        frame = encode({"type": "session", "session": snapshot})
        if frame != self.snapshot_frame:
            self.generation += 1
            self.snapshot_frame = frame
            self._broadcast(("session", self.generation, frame))

    async def _broadcast_events(self, run_id: int, envelopes: list[dict[str, Any]]) -> None:
        # Encoded once for all the sockets of this process.
        await self._fan_out(run_id, [(e["seq"], bool(e["terminal"]), event_frame(e)) for e in envelopes])

    async def _fan_out(self, run_id: int, batch: list[Frame]) -> None:
        """Send to each idle, caught-up socket now; queue for the others.

        Sending on a socket never waits (daphne buffers it), so this costs the feed no more
        than the sends themselves, and spares each socket a wake-up of its task per
        notification (bench/README.md, fan-out).
        """
        for subscriber in tuple(self.subscribers):
            if not await subscriber.offer(run_id, batch):
                subscriber.push(("events", run_id, batch))

    def _broadcast(self, item: Item) -> None:
        for subscriber in tuple(self.subscribers):
            subscriber.push(item)

    # -------------------------------------------------------------- for subscribers

    async def snapshot(self) -> tuple[int, str]:
        """A snapshot read now (so no older than anything broadcast before), with its generation."""
        async with self.snapshot_lock, self.lock:
            self.marker = await database_sync_to_async(session_marker)(self.session_id)
            self._publish_snapshot(await database_sync_to_async(session_snapshot)(self.session_id))
            if self.marker is None or self.snapshot_frame is None:
                raise SessionGone(self.session_id)
            return self.generation, self.snapshot_frame


class LiveHub:
    """The feeds of one event loop (one web process), by session, and their one safety poll.

    One poll for the process, not one per feed: at 100 watched sessions the per-feed polls
    were about half of the web process's CPU (bench/README.md, concurrency).
    """

    def __init__(self) -> None:
        self.feeds: dict[int, SessionFeed] = {}
        self._starting: dict[SessionFeed, asyncio.Future[None]] = {}
        self._poller: asyncio.Task[None] | None = None
        self._journal: asyncio.Task[None] | None = None
        self._journal_joined: asyncio.Future[None] | None = None

    def join(self, session_id: int, subscriber: Subscription) -> SessionFeed:
        if self._journal is None or self._journal.done():
            self._journal_joined = asyncio.get_running_loop().create_future()
            self._journal = asyncio.ensure_future(self._journal_loop(self._journal_joined))
        feed = self.feeds.get(session_id)
        if feed is None:
            feed = self.feeds[session_id] = SessionFeed(session_id)
            self._starting[feed] = asyncio.ensure_future(self._start(feed, self._journal_joined))
        feed.subscribers.add(subscriber)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.ensure_future(self._poll_loop())
        return feed

    @staticmethod
    async def _start(feed: SessionFeed, journal_joined: asyncio.Future[None] | None) -> None:
        # Joined before the feed reads the database: whatever commits after that read reaches it.
        if journal_joined is not None:
            await asyncio.shield(journal_joined)
        await feed.start()

    async def _journal_loop(self, joined: asyncio.Future[None]) -> None:
        """The runners' journal notifications, one channel for every feed of this process.

        A runner publishes each group commit as one message (notify.JOURNAL_GROUP): with a
        channel per session, a hundred streaming runs were thousands of Redis messages a
        second for the web process to parse (bench/README.md, concurrency).
        """
        layer = get_channel_layer()
        channel = None
        try:
            if layer is not None:
                channel = await layer.new_channel()
                await layer.group_add(notify.JOURNAL_GROUP, channel)
        except Exception:
            log.warning("channel layer unavailable: feeds poll the journal", exc_info=True)
            channel = None
        finally:
            joined.set_result(None)
        if layer is None or channel is None:
            return
        try:
            while True:
                try:
                    message = await layer.receive(channel)
                except Exception:
                    # The safety poll covers the gap; the layer reconnects on the next receive.
                    log.warning("journal channel: receive failed", exc_info=True)
                    await asyncio.sleep(1.0)
                    continue
                for item in message.get("runs") or ():
                    feed = self.feeds.get(int(item["session_id"]))
                    if feed is not None:
                        feed.post(item)
        finally:
            with contextlib.suppress(Exception):
                await layer.group_discard(notify.JOURNAL_GROUP, channel)

    def _started_feeds(self) -> list[SessionFeed]:
        return [feed for feed in self.feeds.values() if feed.started]

    async def _poll_loop(self) -> None:
        """Every feed's safety poll, batched: a few queries per interval whatever the feeds."""
        while self.feeds:
            feeds = self._started_feeds()
            interval = min((feed.poll_interval() for feed in feeds), default=poll_seconds(False))
            await asyncio.sleep(interval)
            feeds = self._started_feeds()
            if not feeds:
                continue
            try:
                states = await database_sync_to_async(poll_states)(
                    {feed.session_id: feed.poll_request() for feed in feeds}
                )
            except Exception:
                log.exception("live safety poll failed")
                await asyncio.sleep(1.0)
                continue
            for feed in feeds:
                if self.feeds.get(feed.session_id) is not feed:
                    continue  # it stopped while we read
                try:
                    await feed.check(states[feed.session_id])
                except Exception:
                    log.exception("session %s: live poll failed", feed.session_id)

    async def ready(self, feed: SessionFeed) -> None:
        # Shielded: one subscriber going away must not cancel the start others wait on.
        await asyncio.shield(self._starting[feed])

    async def leave(self, feed: SessionFeed, subscriber: Subscription) -> None:
        feed.subscribers.discard(subscriber)
        if feed.subscribers:
            return
        if self.feeds.get(feed.session_id) is feed:
            del self.feeds[feed.session_id]
        starting = self._starting.pop(feed, None)
        if starting is not None:
            with contextlib.suppress(Exception):
                await starting
            await feed.stop()
        if not self.feeds and self._journal is not None:
            journal, self._journal = self._journal, None
            journal.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await journal


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LiveHub] = weakref.WeakKeyDictionary()


def get_hub() -> LiveHub:
    loop = asyncio.get_running_loop()
    hub = _hubs.get(loop)
    if hub is None:
        hub = _hubs[loop] = LiveHub()
    return hub


# ---------------------------------------------------------------- one socket's subscription


class Subscription:
    """One socket's view of a session: a cursor per run, never a seq sent twice."""

    def __init__(
        self, session_id: int, after: dict[int, int], send: Callable[[str], Awaitable[None]]
    ) -> None:
        self.session_id = session_id
        self.after = after
        self._send = send
        self.sent: dict[int, int] = {}  # run id → highest seq sent on this socket
        self.followed: set[int] = set()
        self.refused: set[int] = set()
        self.done: set[int] = set()
        self.floor = 0  # runs above this id are new to this socket: followed from seq 0
        self.generation = 0
        self.snapshot_frame: str | None = None
        self.backlog: deque[Item] = deque()
        self.overflowed = False
        self._idle = False  # caught up, nothing queued, waiting for the feed
        self._ready = asyncio.Event()
        self.hub: LiveHub | None = None
        self.feed: SessionFeed | None = None

    def push(self, item: Item) -> None:
        """Called by the feed; never blocks it. A subscriber that falls too far behind resyncs."""
        if len(self.backlog) >= SUBSCRIBER_BACKLOG_MAX:
            self.backlog.clear()
            self.overflowed = True
        else:
            self.backlog.append(item)
        self._ready.set()

    async def run(self) -> None:
        """Join, replay, stream until cancelled. Raises SessionGone when the session disappears."""
        try:
            await self._run()
        finally:
            if self.hub is not None and self.feed is not None:
                feed, self.feed = self.feed, None
                await self.hub.leave(feed, self)

    async def _run(self) -> None:
        floor_before = await database_sync_to_async(run_floor)(self.session_id)
        self.hub = get_hub()
        self.feed = self.hub.join(self.session_id, self)
        await self.hub.ready(self.feed)
        plan = await database_sync_to_async(plan_subscription)(self.session_id, self.after, floor_before)
        generation, frame = await self.feed.snapshot()
        await self._send_snapshot(generation, frame)
        for error in plan.errors:
            await self._send(error)
        self.floor = plan.floor
        self.refused = set(plan.refused)
        for run_id in sorted(plan.cursors):
            self.followed.add(run_id)
            self.sent[run_id] = plan.cursors[run_id]
            await self.catch_up(run_id)
        while True:
            self._idle = True
            try:
                await self._ready.wait()
            finally:
                self._idle = False
            self._ready.clear()
            if self.overflowed:
                self.overflowed = False
                await self.resync()
            while self.backlog:
                await self.handle(self.backlog.popleft())

    async def handle(self, item: Item) -> None:
        kind = item[0]
        if kind == "events":
            await self.deliver(item[1], item[2])
        elif kind == "session":
            await self._send_snapshot(item[1], item[2])
        elif kind == "gone":
            raise SessionGone(self.session_id)

    def _follows(self, run_id: int) -> bool:
        if run_id in self.refused or run_id in self.done:
            return False
        if run_id not in self.followed:
            if run_id <= self.floor:
                return False  # neither asked for nor new
            self.followed.add(run_id)
            self.sent[run_id] = 0
        return True

    async def offer(self, run_id: int, batch: list[Frame]) -> bool:
        """Take a batch from the feed directly if this socket is idle and the batch follows on.

        False: it is not (busy, something queued, or a gap to read first); push() it instead.
        """
        if not self._idle or self.backlog or self.overflowed:
            return False
        if not self._follows(run_id):
            return True  # not a run this socket shows
        sent = self.sent[run_id]
        ready: list[Frame] = []
        for frame in batch:
            if frame[0] <= sent + len(ready):
                continue
            if frame[0] != sent + len(ready) + 1:
                return False  # a gap: the subscription's task reads it from the database
            ready.append(frame)
            if frame[1]:
                break
        try:
            await self._send_frames(run_id, ready)
        except Exception:
            return False  # its own task meets the same error, and sent[] says what went out
        return True

    async def deliver(self, run_id: int, batch: list[Frame]) -> None:
        if not self._follows(run_id):
            return
        ready: list[Frame] = []  # consecutive, after what this socket has
        for seq, terminal, frame in batch:
            if seq <= self.sent[run_id] + len(ready):
                continue
            if seq > self.sent[run_id] + len(ready) + 1:
                await self._send_frames(run_id, ready)
                ready = []
                await self.catch_up(run_id, upto=seq - 1)
                if run_id in self.refused or run_id in self.done or seq <= self.sent[run_id]:
                    return
            ready.append((seq, terminal, frame))
            if terminal:
                break
        await self._send_frames(run_id, ready)

    async def _send_frames(self, run_id: int, frames: list[Frame]) -> None:
        """One event as its `event` frame; several as `events` frames (at saturation a frame per
        event per socket was most of the web process: bench/README.md, fan-out)."""
        if len(frames) == 1:
            sends: Iterable[Frame] = frames
        else:
            sends = events_frames(run_id, [(seq, term, envelope_text(f)) for seq, term, f in frames])
        for seq, terminal, frame in sends:
            await self._send(frame)
            self.sent[run_id] = seq
            if terminal:
                self.done.add(run_id)

    async def catch_up(self, run_id: int, upto: int | None = None) -> None:
        """Send run_id's events after what this socket has, from the database, in pages."""
        while run_id not in self.done and (upto is None or self.sent[run_id] < upto):
            try:
                page = await database_sync_to_async(read_page)(run_id, self.sent[run_id], upto)
            except journal.JournalError as exc:
                self.refused.add(run_id)
                await self._send(error_frame(exc.code, str(exc), run_id=run_id))
                return
            except Run.DoesNotExist:
                self.refused.add(run_id)
                return
            for seq, terminal, frame in events_frames(run_id, page.rows):
                await self._send(frame)
                self.sent[run_id] = seq
                if terminal:
                    self.done.add(run_id)
            if not page.rows or not page.has_more:
                return

    async def resync(self) -> None:
        """The backlog was dropped: the database has everything it held."""
        assert self.feed is not None
        pending = [
            run_id for run_id in self.followed if run_id not in self.done and run_id not in self.refused
        ]
        heads = await database_sync_to_async(run_heads)(self.session_id, pending, self.floor)
        for head in heads:
            if self._follows(head.run_id):
                await self.catch_up(head.run_id)
        generation, frame = await self.feed.snapshot()
        await self._send_snapshot(generation, frame)

    async def _send_snapshot(self, generation: int, frame: str) -> None:
        # Generations order the feed's reads: an older snapshot never follows a newer one.
        if generation <= self.generation:
            return
        self.generation = generation
        if frame != self.snapshot_frame:
            self.snapshot_frame = frame
            await self._send(frame)
