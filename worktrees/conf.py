"""Where worktrees live: HERMESWEB_WORKTREE_ROOT (a setting, else the environment), by default
`<data directory>/worktrees`; never inside an allowed root (then a project could claim it)."""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings


def root() -> Path:
    configured = getattr(settings, "HERMESWEB_WORKTREE_ROOT", None) or os.environ.get(
        "HERMESWEB_WORKTREE_ROOT"
    )
    return Path(configured or Path(settings.DATA_DIR) / "worktrees").resolve()


def outside_roots(path: Path) -> bool:
    """Whether `path` is outside every allowed root (and no root is inside it)."""
    for allowed in settings.HERMESWEB_ALLOWED_ROOTS:
        allowed_path = Path(allowed).resolve()
        if path.is_relative_to(allowed_path) or allowed_path.is_relative_to(path):
            return False
    return True
