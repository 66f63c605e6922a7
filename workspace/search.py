"""The project's paths matching a few typed letters: the composer's `@` completion.

Design note: docs/workspace.md ("Files"). The walk opens every directory from the project's
descriptor with O_NOFOLLOW (workspace/fs.py's rule): a symlink is offered as a name, never
entered. `.git`, heavy dependency and build directories and the plain names the project's top
`.gitignore` lists are skipped, and the walk stops after a fixed number of entries, so one
keystroke costs a bounded amount of work whatever the tree.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import stat
from dataclasses import dataclass

from projects.models import Project
from workspace import fs

# Never walked: version control, dependencies and build output (their files are rarely what a
# user means to name, and they hold most of a tree's entries).
SKIPPED_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "node_modules",
        ".venv",
        "venv",
        "__pycache__",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".tox",
        ".cache",
        "dist",
        "build",
        "target",
    }
)
MAX_VISITED = 20_000  # entries looked at per search
MAX_DEPTH = 24
MAX_RESULTS = 50
MAX_QUERY = 200


@dataclass(frozen=True)
class Match:
    path: str
    type: str  # file | dir | symlink


@dataclass(frozen=True)
class Found:
    matches: list[Match]
    truncated: bool  # the walk stopped at MAX_VISITED: a deeper match may exist


def search_paths(project: Project, query: str, limit: int = MAX_RESULTS) -> Found:
    """The project's paths that hold `query`'s letters in order, best first (at most `limit`).

    A name starting with the query beats a name holding it, then a path holding it, then letters
    spread out; then shorter paths first. An empty query lists the top of the tree. fs.Outside
    when the project cannot be opened.
    """
    needle = query.strip().lower()[:MAX_QUERY]
    limit = max(1, min(limit, MAX_RESULTS))
    scored: list[tuple[tuple[int, int, str], Match]] = []
    with fs.project_root(project.path) as root:
        ignored = _top_ignores(root)
        truncated = _walk(root, needle, ignored, scored)
    scored.sort(key=lambda item: item[0])
    return Found([match for _, match in scored[:limit]], truncated)


def _walk(
    root: int, needle: str, ignored: list[str], scored: list[tuple[tuple[int, int, str], Match]]
) -> bool:
    """Fill `scored`; True when the walk stopped at MAX_VISITED."""
    visited = 0
    # Breadth first: near paths are found before the cap can cut the walk.
    pending: list[tuple[int, str, int]] = [(os.dup(root), "", 0)]
    try:
        while pending:
            fd, base, depth = pending.pop(0)
            try:
                names = sorted(os.listdir(fd))
                for name in names:
                    visited += 1
                    if visited > MAX_VISITED:
                        return True
                    try:
                        info = os.lstat(name, dir_fd=fd)
                    except OSError:
                        continue
                    path = f"{base}/{name}" if base else name
                    is_dir = stat.S_ISDIR(info.st_mode)
                    if is_dir and (name in SKIPPED_DIRS or _ignored(name, ignored)):
                        continue
                    kind = "dir" if is_dir else "symlink" if stat.S_ISLNK(info.st_mode) else "file"
                    if not is_dir and not stat.S_ISREG(info.st_mode) and kind != "symlink":
                        continue
                    score = _score(needle, path, name) if needle else (depth, 0, path)
                    if score is not None and (needle or depth == 0):
                        scored.append((score, Match(path, kind)))
                    if is_dir and depth + 1 < MAX_DEPTH and (needle or depth == 0):
                        child = _open_child(fd, name)
                        if child is not None:
                            pending.append((child, path, depth + 1))
            finally:
                os.close(fd)
        return False
    finally:
        for fd, _, _ in pending:
            os.close(fd)


def _open_child(fd: int, name: str) -> int | None:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=fd)
    except OSError:  # swapped for a symlink meanwhile, or unreadable: not walked
        return None


def _score(needle: str, path: str, name: str) -> tuple[int, int, str] | None:
    low_name, low_path = name.lower(), path.lower()
    if low_name.startswith(needle):
        return (0, len(path), path)
    if needle in low_name:
        return (1, len(path), path)
    if needle in low_path:
        return (2, len(path), path)
    at = 0
    for letter in needle:
        at = low_path.find(letter, at)
        if at < 0:
            return None
        at += 1
    return (3, len(path), path)


def _top_ignores(root: int) -> list[str]:
    """The directory patterns of the project's top .gitignore (no negations), for skipping."""
    with contextlib.suppress(OSError):
        data, _ = fs.read_file(root, ".gitignore", 256 * 1024)
        patterns = []
        for line in data.decode("utf-8", errors="replace").splitlines():
            line = line.strip()
            if not line or line.startswith(("#", "!")):
                continue
            line = line.strip("/")
            if line and "/" not in line:
                patterns.append(line)
        return patterns
    return []


def _ignored(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
