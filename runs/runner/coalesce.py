"""The one rule for merging text deltas into journal rows, live and imported.

Design note: docs/runner.md ("The package"). A token or reasoning delta joins the
event before it when both are of one segment (same type, same `message_id` /
`reasoning_id`) and that event's text is still under the limit; anything else
starts a new event. The run's writer buffers a turn through a `Coalescer`
(runs/runner/writer.py); an imported history goes through `merged`
(runs/runner/jobs.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from runs.journal import NewEvent
from runs.journal.payloads import DELTA_SEGMENT_KEYS

# A delta type → the payload key naming its segment (declared with the type).
DELTA_TYPES = DELTA_SEGMENT_KEYS


class Coalescer:
    """Events held for writing, each delta merged into the one before it by the rule above.

    Holds copies: merging never changes an event the caller still has.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.events: list[NewEvent] = []
        self.delta_chars = 0  # the text of the deltas held
        self.has_deltas = False
        # The last event's text while deltas grow it, joined once when taken: `+=` on a
        # long string copies it for every token.
        self._pieces: list[str] | None = None
        self._open_chars = 0

    def add(self, events: Iterable[NewEvent]) -> bool:
        """Hold `events`, merged; True if any of them is not a delta."""
        other = False
        held = self.events
        for event in events:
            kind = event.type
            id_key = DELTA_TYPES.get(kind)
            if id_key is None:
                self._seal()
                held.append(NewEvent(kind, dict(event.payload)))
                self._open_chars = 0
                other = True
                continue
            payload = event.payload
            delta = payload.get("delta", "")
            self.delta_chars += len(delta)
            self.has_deltas = True
            if held:
                last = held[-1]
                if (
                    last.type == kind
                    and self._open_chars < self.limit
                    and last.payload.get(id_key) == payload.get(id_key)
                ):
                    if self._pieces is None:
                        self._pieces = [last.payload["delta"], delta]
                    else:
                        self._pieces.append(delta)
                    self._open_chars += len(delta)
                    continue
            self._seal()
            held.append(NewEvent(kind, dict(payload)))
            self._open_chars = len(delta)
        return other

    def take(self) -> list[NewEvent]:
        """Everything held, in order; the coalescer is empty again."""
        self._seal()
        self._open_chars = 0
        taken, self.events, self.delta_chars, self.has_deltas = self.events, [], 0, False
        return taken

    def _seal(self) -> None:
        if self._pieces is not None:
            self.events[-1].payload["delta"] = "".join(self._pieces)
            self._pieces = None


def merged(events: Iterable[NewEvent], limit: int) -> list[NewEvent]:
    """`events` with their deltas merged by the rule above (copies)."""
    coalescer = Coalescer(limit)
    coalescer.add(events)
    return coalescer.take()
