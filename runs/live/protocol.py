"""The session socket's wire format: the frames the server sends, and parsing what a client sends.

Design note: docs/live-delivery.md ("Protocol", "Layout"). No database and no channel layer
here: the other modules build their frames with these functions.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
import pydantic

from hermesweb.errors import has_nul, validation_details
from projects.refusals import Refused
from runs.schemas import MessageIn, SubmitOut

MAX_MESSAGE_CHARS = 64 * 1024
MAX_CURSORS = 1000
# daphne's WebSocket library refuses to send a message over 1 MiB (and closes the socket):
# a catch-up frame stays under a quarter of that in characters, so under 1 MiB in UTF-8.
CATCHUP_FRAME_CHARS = 256 * 1024
# A page read from the journal holds about this many characters of envelopes. The journal counts
# a page in events (HERMESWEB_EVENTS_PAGE_MAX): a page of large tool outputs (5,000 of 64 KiB)
# would be hundreds of MB in one read, so each page asks for as many events as the previous
# page's size per event says fit, starting from FIRST_PAGE_EVENTS.
PAGE_CHARS = 2 * 1024 * 1024
FIRST_PAGE_EVENTS = 32

# One envelope as JSON text: (seq, terminal, text), the rows journal.read_encoded returns.
# A plain tuple: replay handles every row on every socket, and a NamedTuple per row costs
# several times the tuple.
EventRow = tuple[int, bool, str]


class EventFrame(NamedTuple):
    """An encoded frame carrying one run's events up to `seq`, `terminal` if the last ends the run."""

    seq: int
    terminal: bool
    text: str


# ---------------------------------------------------------------- server → client


def encode(frame: dict[str, Any]) -> str:
    return orjson.dumps(frame).decode()


EVENT_FRAME_HEAD = '{"type":"event","event":'
PONG = encode({"type": "pong"})
HEARTBEAT = encode({"type": "heartbeat"})


def event_frame(envelope: dict[str, Any]) -> str:
    return f"{EVENT_FRAME_HEAD}{orjson.dumps(envelope).decode()}}}"


def envelope_frames(envelopes: Sequence[dict[str, Any]]) -> list[EventFrame]:
    """An `event` frame for each envelope (decoded, as a notification carries them)."""
    return [EventFrame(e["seq"], bool(e["terminal"]), event_frame(e)) for e in envelopes]


def row_frames(rows: Sequence[EventRow]) -> list[EventFrame]:
    """An `event` frame for each row: the envelope is JSON already, wrapping it is all it needs."""
    return [EventFrame(seq, terminal, f"{EVENT_FRAME_HEAD}{text}}}") for seq, terminal, text in rows]


def envelope_text(frame: str) -> str:
    """The envelope's JSON inside an `event` frame."""
    return frame[len(EVENT_FRAME_HEAD) : -1]


def events_frames(run_id: int, rows: Sequence[EventRow]) -> Iterator[EventFrame]:
    """Consecutive envelopes of one run in few `events` frames (a frame costs more than an event).

    Each frame stays under CATCHUP_FRAME_CHARS; an envelope too big to share one gets its own.
    """
    start, size = 0, 0
    for i, (_, _, text) in enumerate(rows):
        if i > start and size + len(text) > CATCHUP_FRAME_CHARS:
            yield _events_frame(run_id, rows[start:i])
            start, size = i, 0
        size += len(text) + 1
    if start < len(rows):
        yield _events_frame(run_id, rows[start:])


def _events_frame(run_id: int, rows: Sequence[EventRow]) -> EventFrame:
    body = ",".join(text for _, _, text in rows)
    seq, terminal, _ = rows[-1]
    return EventFrame(seq, terminal, f'{{"type":"events","run_id":{run_id},"events":[{body}]}}')


def page_events(rows: Sequence[EventRow], budget_chars: int = PAGE_CHARS) -> int:
    """How many events the next page may ask for to hold about `budget_chars`, going by `rows`,
    the page just read (at least one; FIRST_PAGE_EVENTS when there is nothing to go by)."""
    chars = sum(len(text) for _, _, text in rows)
    if not chars:
        return FIRST_PAGE_EVENTS
    return max(1, budget_chars * len(rows) // chars)


def socket_frames(run_id: int, frames: Sequence[EventFrame]) -> Sequence[EventFrame] | Iterator[EventFrame]:
    """What a socket sends for consecutive `event` frames of one run: one alone, several as `events`."""
    if len(frames) == 1:
        return frames
    return events_frames(run_id, [(seq, terminal, envelope_text(text)) for seq, terminal, text in frames])


def session_frame(snapshot: dict[str, Any]) -> str:
    return encode({"type": "session", "session": snapshot})


def error_frame(code: str, message: str, **extra: Any) -> str:
    return encode({"type": "error", "code": code, "message": message, **extra})


def submitted_frame(client_id: str, result: SubmitOut) -> str:
    return encode({"type": "submitted", "client_id": client_id, "result": result.model_dump()})


def refused_frame(client_id: str, status: int, code: str, message: str, **extra: Any) -> str:
    """A submit's answer when it is refused: `status` is the HTTP status the POST would have had."""
    error = {"status": status, "code": code, "message": message, **extra}
    return encode({"type": "submitted", "client_id": client_id, "error": error})


def refusal_frame(client_id: str, refused: Refused) -> str:
    """Any domain refusal as a submit's answer: the status, code and message the API would give."""
    extra = {} if refused.details is None else {"details": refused.details}
    return refused_frame(client_id, refused.status, refused.code, refused.message, **extra)


# ---------------------------------------------------------------- client → server


class BadRequest(Exception):
    code = "bad_request"


class InvalidSubmit(BadRequest):
    """A submit frame whose message is invalid: answered as that message's refusal."""

    code = "validation_error"

    def __init__(self, client_id: str, message: str, details: list[dict[str, Any]]) -> None:
        super().__init__(message)
        self.client_id = client_id
        self.details = details

    def frame(self) -> str:
        return refused_frame(self.client_id, 422, self.code, str(self), details=self.details)


@dataclass(frozen=True)
class Subscribe:
    after: dict[int, int]


@dataclass(frozen=True)
class Ping:
    pass


@dataclass(frozen=True)
class WatchSessions:
    """Follow the live state of all the user's sessions on this socket (`sessions` frames)."""


@dataclass(frozen=True)
class Submit:
    """A message from the composer, as `POST /api/sessions/{id}/messages` takes it (MessageIn)."""

    message: MessageIn


def parse_client_message(text: str | None) -> Subscribe | Ping | Submit | WatchSessions:
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
    if kind == "sessions":
        return WatchSessions()
    if kind != "subscribe":
        raise BadRequest(
            f"unknown message type {kind!r}; expected 'subscribe', 'submit', 'sessions' or 'ping'"
        )
    return Subscribe(_parse_cursors(message.get("after")))


def _parse_cursors(after: Any) -> dict[int, int]:
    if after is None:
        return {}
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
    return cursors


def _answerable(client_id: Any) -> bool:
    """Whether a submit's client id can carry its refusal back (else the frame is malformed)."""
    return isinstance(client_id, str) and 1 <= len(client_id) <= 100 and "\x00" not in client_id


def _parse_submit(message: dict[str, Any]) -> Submit:
    fields = {key: value for key, value in message.items() if key != "type"}
    client_id = fields.get("client_id")
    if has_nul(fields):
        # As the POST refuses it: PostgreSQL cannot store it, and writing it failed as a 500.
        if not _answerable(client_id):
            raise BadRequest("strings must not contain the NUL character (\\u0000)")
        details = [
            {"field": name, "location": "body", "message": "must not contain NUL (\\u0000)", "type": "nul"}
            for name, value in fields.items()
            if has_nul(name) or has_nul(value)
        ]
        raise InvalidSubmit(client_id, "Strings must not contain the NUL character (\\u0000).", details)
    try:
        return Submit(MessageIn.model_validate(fields))
    except pydantic.ValidationError as exc:
        if not _answerable(client_id):
            # No id to answer to: the frame itself is malformed.
            raise BadRequest("a submit needs a 'client_id' of 1 to 100 characters") from None
        # Located as the POST's would be: in the body.
        errors = [{**error, "loc": ("body", "payload", *error["loc"])} for error in exc.errors()]
        details = validation_details(errors)
        fields_text = ", ".join(sorted({detail["field"] for detail in details}))
        raise InvalidSubmit(client_id, f"Invalid input: {fields_text}.", details) from None
