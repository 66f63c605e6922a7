"""The data directory is the service's alone: 0700, and everything in it 0600 (docs/security.md).

It holds the database (every session key and transcript), `secret_key`, logs, attachments and
each user's agent state. Every process of ours sets the umask 0o077 as its settings load, so
what it or a library creates (SQLite's database, WAL and shared-memory files, a log, an agent's
state) is owner-only from its first byte. At start the directory itself and the SQLite files,
which an older version left 0755/0644, are narrowed; `doctor` and `/api/health` report anything
else still wider (`loose_modes`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

PRIVATE_UMASK = 0o077
# SQLite gives a new WAL or shared-memory file its database's mode, whatever the umask: a
# database left 0644 would keep making readable WALs.
SQLITE_SUFFIXES = ("", "-wal", "-shm", "-journal")


def private_umask() -> None:
    """Owner-only for every file and directory this process creates from now on."""
    os.umask(PRIVATE_UMASK)


def narrow(path: Path) -> None:
    """Take the group and other bits off `path` (never through a symlink); gone or not ours: left."""
    try:
        mode = path.lstat().st_mode
        if not stat.S_ISLNK(mode) and mode & 0o077:
            path.chmod(stat.S_IMODE(mode) & 0o700)
    except OSError:  # missing, another owner's, a read-only mount: doctor reports what is left
        pass


def prepare(data_dir: Path) -> None:
    """Make the data directory 0700, or narrow an existing one."""
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    narrow(data_dir)


def narrow_sqlite(database: str | Path) -> None:
    """Narrow a SQLite database and its WAL, shared-memory and journal files."""
    for suffix in SQLITE_SUFFIXES:
        narrow(Path(f"{database}{suffix}"))


def loose_modes(
    data_dir: Path, *, skip: Iterable[Path] = (), deep: bool = True
) -> Iterator[tuple[Path, int]]:
    """(path, mode) of the data directory and of what lies in it with group or other bits.

    `skip` are trees left out: allowed project roots (users' working trees) and collected
    static files (public, served by nginx). Symlinks are not followed and not reported (their own
    mode means nothing). `deep=False` looks at the directory and its direct entries only: what
    /api/health can afford on every call.
    """
    skipped = {Path(p) for p in skip}
    try:
        mode = data_dir.lstat().st_mode
    except OSError:
        return
    if mode & 0o077:
        yield data_dir, stat.S_IMODE(mode)
    pending = [data_dir]
    while pending:
        directory = pending.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            path = Path(entry.path)
            if path in skipped:
                continue
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            if stat.S_ISLNK(mode):
                continue
            if mode & 0o077:
                yield path, stat.S_IMODE(mode)
            if deep and stat.S_ISDIR(mode):
                pending.append(path)


def mode_warnings(
    data_dir: Path, *, skip: Iterable[Path] = (), deep: bool = True, limit: int = 20
) -> list[str]:
    """What doctor and /api/health say of `loose_modes`: at most `limit` lines, then a count."""
    found = sorted(loose_modes(data_dir, skip=skip, deep=deep))
    lines = []
    for path, mode in found[:limit]:
        what = "the data directory" if path == data_dir else str(path.relative_to(data_dir))
        lines.append(f"{what} is {mode:04o}: open to other local accounts (want 0700, files 0600)")
    if len(found) > limit:
        lines.append(f"and {len(found) - limit} more with group or other bits")
    return lines


def settings_warnings(*, deep: bool) -> list[str]:
    """`mode_warnings` of the configured data directory, without the roots and static files."""
    from django.conf import settings

    skip = [*settings.HERMESWEB_ALLOWED_ROOTS, Path(settings.STATIC_ROOT)]
    return mode_warnings(Path(settings.DATA_DIR), skip=skip, deep=deep)
