"""`manage.py runner` with redaction turned off, to measure what redaction costs (bench/security_cost.py).

Off means: the journal writes payloads as they come (runs/journal/append.py's `redact` is the
identity) and the writer's DeltaGuard holds nothing back (runs/runner/redact_stream.py). Never
for anything but a benchmark: secrets would reach the journal.

usage: python bench/unredacted.py runner --id ID   (as manage.py)
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def turn_off() -> None:
    """Redaction off in this process (Django must be set up)."""
    from runs.journal import append
    from runs.journal.events import NewEvent
    from runs.runner.redact_stream import DeltaGuard

    def as_is(value: Any) -> Any:
        return value

    def feed(self: DeltaGuard, events: Iterable[NewEvent]) -> list[NewEvent]:
        return list(events)

    def release(self: DeltaGuard) -> list[NewEvent]:
        return []

    append.redact = as_is  # type: ignore[assignment]
    DeltaGuard.feed = feed  # type: ignore[method-assign]
    DeltaGuard.release = release  # type: ignore[method-assign]


def turn_on_again(saved: tuple[Any, Any, Any]) -> None:
    from runs.journal import append
    from runs.runner.redact_stream import DeltaGuard

    append.redact, DeltaGuard.feed, DeltaGuard.release = saved  # type: ignore[method-assign]


def saved() -> tuple[Any, Any, Any]:
    from runs.journal import append
    from runs.runner.redact_stream import DeltaGuard

    return append.redact, DeltaGuard.feed, DeltaGuard.release


if __name__ == "__main__":
    import django
    from django.core.management import execute_from_command_line

    django.setup()
    turn_off()
    execute_from_command_line(["manage.py", *sys.argv[1:]])
