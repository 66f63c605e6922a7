"""Streamed text held back where a secret could be split: each journal row sees a secret whole.

Design note: docs/security.md ("Redaction"). The journal redacts each row's payload
(runs/journal/append.py), but a model streams text in pieces and the writer's rows cut it at
piece boundaries: `sk-ab` in one row and `c…` in the next pass redaction in both. A
`DeltaGuard` sits in front of the rows: of each delta it passes on at once what no secret can
still be running through, and holds back the shortest tail that could still be the start of
one (runs/redaction.py `opening_start`: at most HOLD_CHARS, or PEM_HOLD_CHARS of a private key
block), to go out with the next piece of its stream. Every piece boundary it leaves is one no
pattern match crosses, so redacting the rows gives the text redaction of the whole stream
would. Ordinary text is rarely held, and then only its last few characters.

Nothing held is lost: any other event, a delta of another stream and the turn's end `release`
the tail first, so the text keeps its place in the journal's order.

`RedactedLog` is the same care for the agents' stderr logs: redacted a line at a time.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

from runs.journal import NewEvent
from runs.redaction import (
    HOLD_CHARS,
    PEM_HOLD_CHARS,
    match_across,
    open_private_key,
    opening_start,
    redact_text,
    secret_at_end,
)
from runs.runner.coalesce import DELTA_TYPES


class DeltaGuard:
    """One run's deltas in, the same text out cut only where no secret runs across the cut."""

    def __init__(self) -> None:
        self._held: NewEvent | None = None  # the tail held back, as a delta of its stream
        # After a secret longer than the hold had to go out unfinished: what would lengthen it,
        # dropped from the start of what follows (the rows redact what went out).
        self._lengthening: re.Pattern[str] | None = None

    def feed(self, events: Iterable[NewEvent]) -> list[NewEvent]:
        """`events` to write now: deltas cut back to where no secret can run on, others as they are."""
        out: list[NewEvent] = []
        for event in events:
            id_key = DELTA_TYPES.get(event.type)
            if id_key is None:
                out += self.release()
                out.append(event)
                continue
            held = self._held
            if held is not None and (
                held.type != event.type or held.payload.get(id_key) != event.payload.get(id_key)
            ):
                out += self.release()
                held = None
            text = event.payload.get("delta", "")
            if self._lengthening is not None:
                text = text[self._lengthening.match(text).end() :]  # type: ignore[union-attr]
                if not text:
                    continue
                self._lengthening = None
            if held is not None:
                text = held.payload["delta"] + text
            sent, kept = self._cut(text)
            if held is None and not kept and sent is event.payload.get("delta"):
                out.append(event)  # the common case: nothing held before or after
                continue
            self._held = NewEvent(event.type, {**event.payload, "delta": kept}) if kept else None
            if sent:
                out.append(NewEvent(event.type, {**event.payload, "delta": sent}))
        return out

    def release(self) -> list[NewEvent]:
        """The tail held back, as a delta: its stream ended (another event, the turn's end)."""
        held, self._held = self._held, None
        self._lengthening = None
        return [] if held is None else [held]

    def _cut(self, text: str) -> tuple[str, str]:
        """(what goes out now, what is held back) of a stream's unwritten text."""
        if len(text) <= SHORT_CHARS:
            cut = short_cut_at(text)
            return text[:cut], text[cut:]
        window = max(0, len(text) - HOLD_CHARS)
        cut = cut_at(text, window)
        if window and cut:
            # A secret that began before the window goes out unfinished: the rest of it
            # must not follow in clear.
            lengthening = secret_at_end(text[:cut])
            if lengthening is not None:
                rest = text[cut:]
                rest = rest[lengthening.match(rest).end() :]  # type: ignore[union-attr]
                if not rest:
                    self._lengthening = lengthening
                    return text[:cut], ""
                again = self._cut(rest)  # at most HOLD_CHARS: no second round
                return text[:cut] + again[0], again[1]
        return text[:cut], text[cut:]


def cut_at(text: str, window: int = 0) -> int:
    """Where the text that can go out ends: before the leftmost opening, and no match across it."""
    start = opening_start(text, window)
    cut = len(text) if start is None else start
    key = open_private_key(text)
    if key is not None and len(text) - key <= PEM_HOLD_CHARS:
        cut = min(cut, key)
    before = max(0, window - HOLD_CHARS)
    while cut < len(text) and (across := match_across(text, cut, before)) is not None:
        cut = across
    return cut


# A model streams a token or a few per delta, and tokens recur: a short text (a delta, after what
# was held) is cut where it was last time (2.5 µs otherwise, most of the writer's own time). None
# this short holds a whole secret (the shortest, `token=abcd`, has 10), so none is kept.
SHORT_CHARS = 9
short_cut_at = lru_cache(maxsize=8192)(cut_at)


def guarded(events: Iterable[NewEvent]) -> list[NewEvent]:
    """A whole stream through a DeltaGuard, nothing held at the end (an imported history)."""
    guard = DeltaGuard()
    return [*guard.feed(events), *guard.release()]


# An agent's stderr line longer than this is cut: a log line, not a dump (and redaction's
# cost stays bounded per line).
MAX_LOG_LINE = 16 * 1024


class RedactedLog:
    """An agent's stderr into its log file a line at a time, redacted, by a thread of its own.

    The agent writes into a pipe (`fd`, for the child) rather than the file itself, so a
    secret it prints never reaches the disk. A thread, not the event loop, drains the pipe:
    a busy loop must not fill it and block the agent. It ends when every writer has closed
    it (the agent and what it started exited).
    """

    def __init__(self, path: Path) -> None:
        read_fd, self.fd = os.pipe()
        self._writer_open = True
        self._file = open(path, "ab")  # noqa: SIM115 - the copying thread closes it
        self._thread = threading.Thread(
            target=self._copy, args=(read_fd,), name=f"agent-log-{path.name}", daemon=True
        )
        self._thread.start()

    def close_writer(self) -> None:
        """Drop this process's end of the pipe (the child has its own): EOF once the child's closes."""
        if self._writer_open:
            self._writer_open = False
            os.close(self.fd)

    def wait(self, timeout: float | None = None) -> None:
        """Until everything written has reached the file (tests; the runner never waits)."""
        self._thread.join(timeout)

    def _copy(self, read_fd: int) -> None:
        with open(read_fd, "rb") as pipe, self._file:
            while line := pipe.readline(MAX_LOG_LINE):
                cut = 0
                if len(line) == MAX_LOG_LINE and not line.endswith(b"\n"):
                    while (rest := pipe.readline(MAX_LOG_LINE)) and not rest.endswith(b"\n"):
                        cut += len(rest)
                    cut += len(rest)
                text = line.decode(errors="replace")
                if cut:
                    text = f"{text} … [{cut} bytes cut]\n"
                self._file.write(redact_text(text).encode())
                self._file.flush()
