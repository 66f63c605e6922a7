"""ACP's `fs/read_text_file` and `fs/write_text_file`: the agent's reads and writes of its project.

Design note: docs/runner.md ("Client capabilities"). The agent names an absolute path as it sees
it in its sandbox, where the project is bound at its own path (and at the session's cwd when
that differs). Only a path inside the project is served, opened one component at a time without
following a symlink (workspace/fs.py over projects/pathfd.py, the sandbox's rule): `..`, an
absolute path elsewhere, a symlink (one swapped in during the request included) and another
user's project all get the same "resource not found" error, saying nothing of what is there.

A write happens in the project's tree, so the run's end checkpoint and the workspace's changes
see it. It is made only while a turn of that session runs and is not being stopped: the agent
asks the user through its own permission flow first; the runner never grants anything itself.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import acp
from acp import schema

from workspace import fs

# A read larger than this is refused (ACP's reads are text the agent puts in its context).
MAX_READ_BYTES = 8 * 1024 * 1024
MAX_WRITE_BYTES = 8 * 1024 * 1024


def not_found(path: str) -> acp.RequestError:
    """The one answer for a path outside the project, a symlink or a missing file."""
    return acp.RequestError.resource_not_found(path)


def refused(message: str) -> acp.RequestError:
    return acp.RequestError.invalid_request({"message": message})


@dataclass(frozen=True)
class ProjectFiles:
    """A project's directory and the other names the agent may use for it (the session's cwd)."""

    root: Path
    aliases: tuple[str, ...] = ()

    def relative(self, path: str) -> str:
        """`path` relative to the project; RequestError when it is not a plain path inside it."""
        if not isinstance(path, str) or not path.startswith("/") or "\x00" in path:
            raise not_found(str(path))
        for base in (str(self.root), *self.aliases):
            base = base.rstrip("/") or "/"
            if path == base:
                raise not_found(path)  # the directory itself is not a text file
            if path.startswith(base + "/"):
                relative = path[len(base) + 1 :]
                try:
                    fs.parts_of(relative)
                except fs.Outside:
                    raise not_found(path) from None
                return relative
        raise not_found(path)

    def directory(self, path: str) -> str:
        """`path` as a directory inside the project (a terminal's cwd): the project itself or below."""
        for base in (str(self.root), *self.aliases):
            if path.rstrip("/") == base.rstrip("/"):
                return ""
        relative = self.relative(path)
        try:
            with fs.project_root(self.root) as root:
                os.close(fs.open_dir(root, fs.parts_of(relative)))
        except fs.Outside:
            raise not_found(path) from None
        return relative


def require_turn(sink: Any) -> None:
    """A file is written (a command run) only for a session whose turn runs now and is not stopping."""
    if sink is None:
        raise refused("No turn is running on this session.")
    cancelling = getattr(sink, "cancel_requested", None)
    if cancelling is not None and cancelling.is_set():
        raise refused("The turn is being stopped.")


def select_lines(text: str, line: int | None, limit: int | None) -> str:
    """Lines `line` (1-based) onwards, at most `limit` of them, each with its line ending."""
    if line is None and limit is None:
        return text
    lines = text.splitlines(keepends=True)
    start = max((line or 1) - 1, 0)
    end = len(lines) if limit is None else start + max(limit, 0)
    return "".join(lines[start:end])


def _read(files: ProjectFiles, path: str) -> bytes:
    relative = files.relative(path)
    try:
        with fs.project_root(files.root) as root:
            data, _ = fs.read_file(root, relative, MAX_READ_BYTES)
    except fs.Outside:
        raise not_found(path) from None
    except fs.TooBig as exc:
        raise refused(f"{path} is {exc.size} bytes, more than {MAX_READ_BYTES} this client reads.") from None
    return data


def _write(files: ProjectFiles, path: str, data: bytes) -> None:
    relative = files.relative(path)
    try:
        with fs.project_root(files.root) as root:
            fs.write_file(root, relative, data, create_dirs=True)
    except fs.Outside:
        raise not_found(path) from None


async def read_text_file(
    files: ProjectFiles | None, path: str, line: int | None, limit: int | None
) -> schema.ReadTextFileResponse:
    if files is None:
        raise not_found(path)
    data = await asyncio.to_thread(_read, files, path)
    text = data.decode("utf-8", errors="replace")
    return schema.ReadTextFileResponse(content=select_lines(text, line, limit))


async def write_text_file(
    files: ProjectFiles | None, sink: Any, path: str, content: str
) -> schema.WriteTextFileResponse:
    require_turn(sink)
    if files is None:
        raise not_found(path)
    data = content.encode("utf-8")
    if len(data) > MAX_WRITE_BYTES:
        raise refused(f"The content is {len(data)} bytes, more than {MAX_WRITE_BYTES} this client writes.")
    await asyncio.to_thread(_write, files, path, data)
    return schema.WriteTextFileResponse()


def project_files(project: Path | None, cwd: str, extra: Sequence[str] = ()) -> ProjectFiles | None:
    """The files an agent started in `project` (checked by the pool) may name, or None before it is placed."""
    if project is None:
        return None
    aliases = tuple(a for a in (cwd, *extra) if a and a.rstrip("/") != str(project))
    return ProjectFiles(project, aliases)
