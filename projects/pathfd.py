"""Open what goes into a sandbox without following a symlink, and bind the descriptor.

A path checked by name and bound by name can change in between: an agent that swaps a
symlink in for a directory of its own project (renameat2 with RENAME_EXCHANGE, in a loop)
made bwrap bind another user's project. So every path bound into a sandbox is opened here,
one component at a time from `/` with O_NOFOLLOW, and bwrap gets the descriptor
(`--bind-fd`): what is mounted is the directory that was opened, whatever the name means later.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class UnsafePath(OSError):
    """A path to bind that holds a symlink or is not what it was (docs/security.md)."""


def open_directory(path: Path) -> int:
    """A descriptor on the directory `path`, no component of which may be a symlink.

    The caller closes it. Raises UnsafePath when a component is a symlink (or not a
    directory) at the moment it is opened, FileNotFoundError when it is missing.
    """
    return _open(path, directory=True)


def open_file(path: Path) -> int:
    """An O_PATH descriptor on the regular file `path` (for a read-only bind), no symlinks."""
    return _open(path, directory=False)


def _open(path: Path, *, directory: bool) -> int:
    if not path.is_absolute():
        raise UnsafePath(f"{path} is not absolute")
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        parts = path.parts[1:]
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            if part in (".", ".."):
                raise UnsafePath(f"{path} has a {part!r} component")
            if last and not directory:
                flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
            elif last:
                # A real descriptor (not O_PATH): the runner walks the tree through it (chown).
                flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            else:
                flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            try:
                child = os.open(part, flags, dir_fd=fd)
            except (NotADirectoryError, OSError) as exc:
                if isinstance(exc, FileNotFoundError):
                    raise
                raise UnsafePath(
                    f"{path}: {part!r} is a symlink or not a directory ({exc.strerror})"
                ) from None
            os.close(fd)
            fd = child
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISDIR(mode) if directory else stat.S_ISREG(mode)):
            raise UnsafePath(f"{path} is not a {'directory' if directory else 'regular file'}")
        # Where the kernel says the opened object is: the same name, or it moved meanwhile.
        where = os.readlink(f"/proc/self/fd/{fd}")
        if where != str(path):
            raise UnsafePath(f"{path} moved while it was opened (now {where})")
        return fd
    except BaseException:
        os.close(fd)
        raise


def give_tree(fd: int, uid: int, gid: int) -> int:
    """Make the tree under the directory `fd` owned by `uid`:`gid` (entries not already); how many.

    Walks by descriptors (os.fwalk) and changes symlinks themselves, never what they point to:
    an agent that swaps a link in for a directory mid-walk gets nothing outside the tree.
    """
    changed = 0
    if os.fstat(fd).st_uid != uid:
        os.fchown(fd, uid, gid)
        changed += 1
    for _, dirs, files, dir_fd in os.fwalk(".", dir_fd=fd, follow_symlinks=False):
        for name in (*dirs, *files):
            try:
                if os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_uid != uid:
                    os.chown(name, uid, gid, dir_fd=dir_fd, follow_symlinks=False)
                    changed += 1
            except FileNotFoundError:
                continue  # removed meanwhile
    return changed
