"""Long-lived processes keep what they loaded at startup out of the garbage collector's full passes.

A full collection walks every tracked object: in a web process or a runner that is ~100k
objects of modules, classes and settings, tens of milliseconds during which no event is
delivered and no journal write is sent. Frozen (`gc.freeze`) once the process has loaded,
they are never walked again.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from typing import Any

import pytest
from django.core.management import call_command

from runs.runner import process


def test_the_web_entry_point_freezes_what_it_loaded() -> None:
    # A process of its own: freezing is process-wide, and this one has imported far more.
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "hermesweb.settings"}
    out = subprocess.run(
        [sys.executable, "-c", "import gc, hermesweb.asgi; print(gc.get_freeze_count())"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert int(out.stdout.split()[-1]) > 10_000  # Django, Channels and the app, frozen


def test_the_runner_command_freezes_before_it_starts_its_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    happened: list[str] = []

    async def run(self: Any) -> None:
        happened.append("run")

    monkeypatch.setattr(gc, "freeze", lambda: happened.append("freeze"))
    monkeypatch.setattr(process.RunnerProcess, "run", run)
    call_command("runner", "--id", "gc-test")
    assert happened == ["freeze", "run"]
