"""Paths inside a project, opened without following a symlink: the files API and the rewind.

The same rule as the agent sandbox's binds: projects/pathfd.py opens the project one component
at a time from `/` with O_NOFOLLOW, and every path inside it is opened from that descriptor the
same way, so a symlink anywhere (one swapped in during the request included) is refused, never
followed out of the project.
Callers turn `Outside` into a 404.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from projects.pathfd import open_directory

MAX_COMPONENTS = 256


class Outside(OSError):
    """The path is not a plain path inside the project: absolute, `..`, a symlink, missing."""


def parts_of(relative: str) -> list[str]:
    """The components of a project-relative path; Outside for absolute, `..`, NUL or empty parts."""
    if "\x00" in relative or relative.startswith("/"):
        raise Outside(f"{relative!r} is not a path inside the project")
    parts = [p for p in PurePosixPath(relative).parts if p not in ("", ".")]
    if any(p == ".." for p in parts) or len(parts) > MAX_COMPONENTS:
        raise Outside(f"{relative!r} is not a path inside the project")
    return parts


def open_root(project_path: str | Path) -> int:
    """A descriptor on the project's directory, no component of its path a symlink."""
    try:
        return open_directory(Path(project_path))
    except OSError as exc:  # UnsafePath, missing, unreadable: not a place to serve
        raise Outside(f"{project_path}: {exc}") from None


@contextlib.contextmanager
def project_root(project_path: str | Path) -> Iterator[int]:
    fd = open_root(project_path)
    try:
        yield fd
    finally:
        os.close(fd)


def open_dir(
    root: int, parts: list[str], *, create: bool = False, owner: tuple[int, int] | None = None
) -> int:
    """A new descriptor on the directory `parts` under `root` (no symlinks); made when `create`."""
    fd = os.dup(root)
    try:
        for part in parts:
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                child = os.open(part, flags, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise Outside(f"{part!r} does not exist") from None
                os.mkdir(part, 0o755, dir_fd=fd)
                child = os.open(part, flags, dir_fd=fd)
                os.fchmod(child, 0o755)  # not the process's umask: the agent reads it too
                if owner is not None:
                    os.fchown(child, *owner)
            except OSError as exc:
                raise Outside(f"{part!r}: {exc.strerror}") from None
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def owner_of(root: int) -> tuple[int, int]:
    """Who what we create belongs to: the project directory's owner (the agent account, often)."""
    info = os.fstat(root)
    return info.st_uid, info.st_gid


def read_file(root: int, relative: str, max_bytes: int) -> tuple[bytes, os.stat_result]:
    """The bytes of the regular file `relative`; Outside for anything else or a file too large."""
    parts = parts_of(relative)
    if not parts:
        raise Outside("no file named")
    parent = open_dir(root, parts[:-1])
    try:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
        except OSError as exc:
            raise Outside(f"{relative!r}: {exc.strerror}") from None
    finally:
        os.close(parent)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Outside(f"{relative!r} is not a regular file")
        if info.st_size > max_bytes:
            raise TooBig(info.st_size)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks), info
    finally:
        os.close(fd)


class TooBig(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(f"{size} bytes")
        self.size = size


def write_file(
    root: int,
    relative: str,
    data: bytes,
    *,
    executable: bool | None = None,
    create_dirs: bool = False,
    replace_links: bool = False,
) -> os.stat_result:
    """Write `data` as the regular file `relative`, in place when it exists (its owner and mode
    kept), else new (owned like the project, 0644); a symlink there is replaced, never followed.

    `executable` sets or clears the executable bits (where the file is readable); None keeps them.
    A symlink (or other non-file) at the path is Outside unless `replace_links` (a rewind's).
    """
    parts = parts_of(relative)
    if not parts:
        raise Outside("no file named")
    owner = owner_of(root)
    parent = open_dir(root, parts[:-1], create=create_dirs, owner=owner)
    try:
        name = parts[-1]
        try:
            existing = os.lstat(name, dir_fd=parent)
        except FileNotFoundError:
            existing = None
        if existing is not None and stat.S_ISDIR(existing.st_mode):
            raise Outside(f"{relative!r} is a directory")
        if existing is not None and not stat.S_ISREG(existing.st_mode):
            if not replace_links:
                raise Outside(f"{relative!r} is not a regular file")
            os.unlink(name, dir_fd=parent)
            existing = None
        flags = (
            os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_TRUNC if existing else os.O_CREAT | os.O_EXCL)
        )
        fd = os.open(name, flags, 0o600, dir_fd=parent)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            mode = stat.S_IMODE(os.fstat(fd).st_mode) if existing else 0o644
            if executable is not None:
                readable = mode & 0o444
                mode = (mode & ~0o111) | ((readable >> 2) if executable else 0)
            os.fchmod(fd, mode)
            if existing is None:
                os.fchown(fd, *owner)
            return os.fstat(fd)
        finally:
            os.close(fd)
    finally:
        os.close(parent)


def write_symlink(root: int, relative: str, target: bytes) -> None:
    """Make `relative` the symlink to `target` (a checkpoint's link), replacing a file there."""
    parts = parts_of(relative)
    owner = owner_of(root)
    parent = open_dir(root, parts[:-1], create=True, owner=owner)
    try:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISDIR(os.lstat(parts[-1], dir_fd=parent).st_mode):
                raise Outside(f"{relative!r} is a directory")
            os.unlink(parts[-1], dir_fd=parent)
        os.symlink(os.fsdecode(target), parts[-1], dir_fd=parent)
        os.chown(parts[-1], *owner, dir_fd=parent, follow_symlinks=False)
    finally:
        os.close(parent)


def remove_file(root: int, relative: str) -> None:
    """Remove the file (or symlink) `relative`, then its parent directories left empty."""
    parts = parts_of(relative)
    try:
        parent = open_dir(root, parts[:-1])
    except Outside:
        return  # its directory is gone: so is it
    try:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISDIR(os.lstat(parts[-1], dir_fd=parent).st_mode):
                raise Outside(f"{relative!r} is a directory")
            os.unlink(parts[-1], dir_fd=parent)
    finally:
        os.close(parent)
    for depth in range(len(parts) - 1, 0, -1):
        above = open_dir(root, parts[: depth - 1])
        try:
            os.rmdir(parts[depth - 1], dir_fd=above)
        except OSError:
            break  # not empty (or gone): stop climbing
        finally:
            os.close(above)


def list_dir(root: int, relative: str) -> list[tuple[str, os.stat_result]]:
    """The entries of the directory `relative` with their lstat, unsorted."""
    fd = open_dir(root, parts_of(relative))
    try:
        out = []
        for name in os.listdir(fd):
            with contextlib.suppress(FileNotFoundError):
                out.append((name, os.lstat(name, dir_fd=fd)))
        return out
    finally:
        os.close(fd)
