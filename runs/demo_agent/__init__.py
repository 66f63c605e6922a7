"""hermesweb's bundled demo ACP agent (deterministic, no model).

Run it as ``python -m runs.demo_agent [--home DIR] [--delay SECONDS]`` with the project root on
``PYTHONPATH``. This package must stay importable without Django: it runs as its own process with
only the ACP SDK installed, and this ``__init__`` imports nothing heavier than the standard library
so the workbench can use :func:`spawn_command` / :func:`spawn_env` cheaply.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

__version__ = "0.1.0"
AGENT_NAME = "hermesweb-demo"
MODULE = "runs.demo_agent"
# The directory that contains the ``runs`` package; it must be on the agent's PYTHONPATH.
PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent


def spawn_command(home: str | os.PathLike[str] | None = None, *, python: str | None = None) -> list[str]:
    """The argv that starts the demo agent (pass ``argv[0]`` and ``*argv[1:]`` to spawn_agent_process)."""
    argv = [python or sys.executable, "-m", MODULE]
    if home is not None:
        argv += ["--home", os.fspath(home)]
    return argv


def spawn_env(extra: Mapping[str, str] | None = None, *, delay: float | None = None) -> dict[str, str]:
    """Environment additions the agent needs (merged over the SDK's trimmed default environment)."""
    pythonpath = os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": pythonpath, "PYTHONUNBUFFERED": "1"}
    if delay is not None:
        env["HERMESWEB_DEMO_DELAY"] = str(delay)
    if extra:
        env.update(extra)
    return env
