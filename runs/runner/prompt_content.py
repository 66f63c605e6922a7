"""A turn's `session/prompt` content: its attachments as ACP blocks, then the prompt text.

Design note: docs/agents.md ("Attachments"). Images go as `image` blocks (base64) when the
agent advertises `promptCapabilities.image`; text files as embedded `resource` blocks when
it advertises `embeddedContext`, else as a text block that names the file and holds its
text. A turn without attachments costs nothing here: no read, one text block.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from acp import helpers
from django.conf import settings

from runs.models import Attachment
from runs.runner.connections import retried
from runs.runner.leases import ClaimedRun
from workspace.mentions import mention_blocks, stored_mentions


@dataclass(frozen=True)
class AttachmentFile:
    """One attachment of the turn, read from the data directory."""

    id: int
    name: str
    mime_type: str
    data: bytes

    @property
    def uri(self) -> str:
        # Names the file to the agent; the bytes travel in the block itself.
        return f"attachment://{self.id}/{quote(self.name)}"


def stored_attachments(raw: Any) -> list[dict[str, Any]]:
    """The run's stored list, keeping only entries that name an upload (older runs stored any metadata)."""
    return [item for item in raw or () if isinstance(item, dict) and isinstance(item.get("id"), int)]


def read_attachments(session_id: int, described: Sequence[dict[str, Any]]) -> list[AttachmentFile]:
    """The files of `described` that belong to the session, in order (a deleted one is left out)."""
    ids = [item["id"] for item in described]
    rows = {row.pk: row for row in Attachment.objects.filter(pk__in=ids, session_id=session_id)}
    files: list[AttachmentFile] = []
    for pk in ids:
        row = rows.get(pk)
        if row is None:
            continue
        try:
            data = (Path(settings.DATA_DIR) / row.path).read_bytes()
        except FileNotFoundError:
            continue
        files.append(AttachmentFile(row.pk, row.name, row.mime_type, data))
    return files


def content_blocks(
    text: str, files: Sequence[AttachmentFile], prompt_capabilities: dict[str, Any]
) -> list[Any]:
    """The attachments as the agent can take them, then the prompt text."""
    blocks: list[Any] = []
    for file in files:
        if file.mime_type.startswith("image/"):
            if prompt_capabilities.get("image"):
                encoded = base64.b64encode(file.data).decode("ascii")
                blocks.append(helpers.image_block(encoded, file.mime_type, uri=file.uri))
            else:  # uploaded before the agent stopped taking images: say so rather than drop it
                blocks.append(
                    helpers.text_block(f"[Attached image {file.name} not sent: this agent takes no images.]")
                )
            continue
        body = file.data.decode("utf-8", errors="replace")
        if prompt_capabilities.get("embeddedContext"):
            resource = helpers.embedded_text_resource(file.uri, body, mime_type=file.mime_type)
            blocks.append(helpers.resource_block(resource))
        else:
            blocks.append(helpers.text_block(f"Attached file {file.name} ({file.mime_type}):\n\n{body}"))
    blocks.append(helpers.text_block(text))
    return blocks


async def prompt_blocks(claimed: ClaimedRun, capabilities: dict[str, Any]) -> list[Any]:
    """The prompt of `claimed` for an agent whose initialize summary is `capabilities`."""
    described = stored_attachments(claimed.attachments)
    mentioned = stored_mentions(claimed.attachments)
    if not described and not mentioned:
        return [helpers.text_block(claimed.prompt_text)]
    files = await retried(read_attachments, claimed.session_id, described) if described else []
    prompt_capabilities = capabilities.get("prompt_capabilities") or {}
    blocks = content_blocks(claimed.prompt_text, files, prompt_capabilities)
    if mentioned:  # `@` paths, before the text (workspace/mentions.py)
        links = await asyncio.to_thread(mention_blocks, claimed.cwd, mentioned, prompt_capabilities)
        blocks[-1:-1] = links
    return blocks
