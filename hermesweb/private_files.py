"""Secret files (`secret_key`, `initial-password`): mode 0600 from their first byte.

Written then chmod-ed, a file is readable by everyone for a moment (and for good if the
process dies in between). Here the content goes to a temporary file created 0600, which
is then hard-linked into place: the name appears complete or not at all, and a file some
other process created first (two processes starting at once) is kept, never overwritten.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

PRIVATE_MODE = 0o600


def initial_password_file() -> Path:
    """Where bootstrap keeps the password it generated, until its user first signs in."""
    from django.conf import settings

    return Path(settings.DATA_DIR) / "initial-password"


def create_private_file(path: Path, text: str) -> bool:
    """Create `path` holding `text`, owner-only; False (and nothing written) if it exists."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    # O_EXCL | O_NOFOLLOW: never write through a link someone planted under the temporary name.
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_MODE)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def restrict(path: Path) -> None:
    """Take group and other bits off a secret file an older version wrote with a wider mode."""
    mode = path.stat().st_mode
    if mode & 0o077:
        path.chmod(PRIVATE_MODE)
