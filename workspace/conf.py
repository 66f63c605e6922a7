"""The workspace's limits: a Django setting of the same name wins, else the environment.

Read at each use, so tests (and an operator's settings module) can change them without a
restart; docs/workspace.md lists them.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings

# Left out of every checkpoint besides what the project's .gitignore ignores (gitignore syntax).
DEFAULT_EXCLUDE = ("node_modules/", ".venv/", "__pycache__/", "*.pyc", ".DS_Store")


def _int(name: str, default: int) -> int:
    value = getattr(settings, name, None)
    if value is None:
        raw = os.environ.get(name, "").strip()
        value = int(raw) if raw else default
    return int(value)


def enabled() -> bool:
    """Whether runners take checkpoints at all (`HERMESWEB_CHECKPOINTS=0` turns them off)."""
    value = getattr(settings, "HERMESWEB_CHECKPOINTS", None)
    if value is None:
        value = os.environ.get("HERMESWEB_CHECKPOINTS", "1").strip().lower() not in (
            "0",
            "false",
            "no",
            "off",
        )
    return bool(value)


def store_root() -> Path:
    """Where each project's private object store lives: inside the data directory, which the
    agent sandbox covers with an empty tmpfs (docs/security.md), so no agent reads or rewrites it."""
    return Path(settings.DATA_DIR) / "checkpoints"


def max_file_bytes() -> int:
    """A file larger than this is left out of checkpoints and listed as "not checkpointed"."""
    return _int("HERMESWEB_CHECKPOINT_MAX_FILE_BYTES", 10 * 1024 * 1024)


def max_files() -> int:
    """A tree with more files than this turns checkpoints off for its project."""
    return _int("HERMESWEB_CHECKPOINT_MAX_FILES", 100_000)


def max_bytes() -> int:
    """A tree with more bytes than this (files under the per-file cap) turns checkpoints off."""
    return _int("HERMESWEB_CHECKPOINT_MAX_BYTES", 2 * 1024 * 1024 * 1024)


def exclude() -> list[str]:
    """Patterns (gitignore syntax) the operator leaves out, comma-separated in the environment."""
    value = getattr(settings, "HERMESWEB_CHECKPOINT_EXCLUDE", None)
    if value is None:
        raw = os.environ.get("HERMESWEB_CHECKPOINT_EXCLUDE")
        value = DEFAULT_EXCLUDE if raw is None else [p.strip() for p in raw.split(",") if p.strip()]
    return list(value)


def diff_max_bytes() -> int:
    """A file's unified diff longer than this is cut (`truncated: true`)."""
    return _int("HERMESWEB_CHANGES_DIFF_MAX_BYTES", 256 * 1024)


def file_max_bytes() -> int:
    """The largest file the files API reads or writes whole."""
    return _int("HERMESWEB_FILES_MAX_BYTES", 10 * 1024 * 1024)
