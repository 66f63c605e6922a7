"""The journal's vocabulary: new events, the terminal `done`, and its refusals (docs/journal.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Unpack

from runs.journal.payloads import Done, DoneDetails
from runs.models import TERMINAL_STATUSES, EventType, JournalEvent

TERMINAL_STATES = {s.value for s in TERMINAL_STATUSES}


class JournalError(Exception):
    code = "journal_error"


class AlreadyTerminal(JournalError):
    code = "already_terminal"


class CursorAhead(JournalError):
    code = "cursor_ahead"


class CursorExpired(JournalError):
    code = "cursor_expired"


class Appended(NamedTuple):
    """A batch as written: its rows with their seqs, and the run's session."""

    rows: list[JournalEvent]
    session_id: int


@dataclass
class NewEvent:
    type: str
    # The type's declared payload (runs/journal/payloads.py, PAYLOADS), as a plain dict.
    payload: dict[str, Any] = field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        return self.type == EventType.DONE


def done_event(state: str, **details: Unpack[DoneDetails]) -> NewEvent:
    if state not in TERMINAL_STATES:
        raise ValueError(f"terminal state must be one of {sorted(TERMINAL_STATES)}, got {state!r}")
    payload: Done = {"state": state, **details}
    return NewEvent(EventType.DONE, payload)
