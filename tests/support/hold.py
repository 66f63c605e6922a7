"""Turns held open by the test: the demo agent's `hold` word (docs/demo-agent.md).

A held turn streams "Held chunk N. " until the test releases it, so a test that needs a turn to
stay open while it acts does not race a stream's duration on a busy machine.
"""

from __future__ import annotations

from pathlib import Path

from runs.demo_agent.scripts import HOLD_RELEASE_FILE


def release(cwd: str | Path) -> None:
    """Let the held turn in this working directory finish (it ends within ~50 ms)."""
    (Path(cwd) / HOLD_RELEASE_FILE).touch()
