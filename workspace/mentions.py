"""`@` mentions: project paths a message names, sent to the agent beside its text.

Design note: docs/workspace.md ("Mentions"). A message's mentions ride in its stored
`attachments` list as `{"mention": "<project-relative path>"}` entries, so they are as durable
and idempotent as uploads: the same turn or intent row, the same client_id. The paths are
checked for shape when the message is taken (no `..`, not absolute) and read by the runner when
the prompt is built, from the project opened without following a symlink (workspace/fs.py): a
small text file goes as an embedded `resource` when the agent takes embedded context, anything
else as a `resource_link` to its file URI; a path gone by then is said so in a text block.
"""

from __future__ import annotations

import mimetypes
import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from acp import helpers

from projects.refusals import Refused
from workspace import fs

MAX_MENTIONS = 20
# A mentioned file this small goes whole into the prompt (when the agent takes embedded context).
EMBED_MAX_BYTES = 64 * 1024


def describe_mentions(paths: Iterable[str]) -> list[dict[str, Any]]:
    """The stored form of `paths` (normalised, each once, in order); 422 `invalid_mention` for a
    path that is not a plain one inside a project."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for path in paths:
        try:
            parts = fs.parts_of(path)
        except fs.Outside:
            parts = []
        if not parts or parts[0] == ".git":
            message = f"{path!r} is not a path inside the project."
            raise Refused(422, "invalid_mention", message, {"path": path})
        normal = "/".join(parts)
        if normal not in seen:
            seen.add(normal)
            out.append({"mention": normal})
    if len(out) > MAX_MENTIONS:
        raise Refused(422, "invalid_mention", f"A message may mention at most {MAX_MENTIONS} paths.")
    return out


def stored_mentions(raw: Any) -> list[str]:
    """The mentioned paths of a turn's stored attachments list, in order."""
    return [
        item["mention"]
        for item in raw or ()
        if isinstance(item, dict) and isinstance(item.get("mention"), str) and item["mention"]
    ]


def mention_blocks(cwd: str, paths: Sequence[str], prompt_capabilities: dict[str, Any]) -> list[Any]:
    """The ACP blocks for `paths` in the project at `cwd` (blocking: the runner calls it in a thread)."""
    embed = bool(prompt_capabilities.get("embeddedContext"))
    blocks: list[Any] = []
    try:
        root = fs.open_root(cwd)
    except fs.Outside:
        named = ", ".join("@" + p for p in paths)
        return [helpers.text_block(f"[Mentioned {named}: the project is not there.]")]
    try:
        for path in paths:
            blocks.append(_block(root, cwd, path, embed))
    finally:
        os.close(root)
    return blocks


def _block(root: int, cwd: str, path: str, embed: bool) -> Any:
    uri = (Path(cwd) / path).as_uri()
    name = path.rsplit("/", 1)[-1]
    try:
        info = _lstat(root, path)
    except fs.Outside:
        info = None
    if info is None:
        return helpers.text_block(f"[@{path} was mentioned, but it is not in the project now.]")
    if stat.S_ISDIR(info.st_mode):
        return helpers.resource_link_block(name, uri, mime_type="inode/directory", title=path)
    mime = mimetypes.guess_type(name)[0] or "text/plain"
    if embed and stat.S_ISREG(info.st_mode) and info.st_size <= EMBED_MAX_BYTES:
        try:
            data, _ = fs.read_file(root, path, EMBED_MAX_BYTES)
            text = data.decode("utf-8")
        except (fs.Outside, fs.TooBig, UnicodeDecodeError):
            text = None
        if text is not None and "\x00" not in text:
            return helpers.resource_block(helpers.embedded_text_resource(uri, text, mime_type=mime))
    size = info.st_size if stat.S_ISREG(info.st_mode) else None
    return helpers.resource_link_block(name, uri, mime_type=mime, size=size, title=path)


def _lstat(root: int, path: str) -> os.stat_result | None:
    parts = fs.parts_of(path)
    parent = fs.open_dir(root, parts[:-1])
    try:
        return os.lstat(parts[-1], dir_fd=parent)
    except FileNotFoundError:
        return None
    finally:
        os.close(parent)
