"""Attachments: files a user uploads to a session and sends to the agent with a message.

Design note: docs/agents.md ("Attachments"), docs/security.md ("Attachments"). The bytes live
under the data directory (`attachments/u<owner>/s<session>/<random>`, 0600 in 0700
directories), never inside a project or an allowed root, and are served to their owner only.
The type is read from the content (image magic bytes, or valid UTF-8 text), never taken from
the client; an image the session's agent cannot take is refused before it is stored.
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import mimetypes
import os
import secrets
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.db.models.signals import post_delete
from django.dispatch import receiver
from django.utils import timezone

from projects.models import Session
from projects.refusals import Refused
from projects.services import hold_owner
from runs.models import Attachment, Runner

ATTACHMENTS_DIR = "attachments"
# Owner-only, as every file in the data directory (hermesweb.private_files): an upload is the user's.
FILE_MODE = 0o600
TEXT_MIME = "text/plain"
# Magic bytes of the images agents take (ACP `image` blocks): PNG, JPEG, GIF, WebP.
_IMAGE_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)
# Text kinds worth naming to the agent; anything else that decodes as UTF-8 is text/plain.
_TEXT_LIKE = ("application/json", "application/xml", "application/javascript", "application/x-sh")


class AttachmentRefused(Refused):
    """An upload not stored: `status` and `code` as the API answers it."""


@dataclass(frozen=True)
class Upload:
    """An uploaded file as the web edge hands it over: a name, chunks of bytes, a claimed size."""

    name: str
    chunks: Iterable[bytes]
    size: int | None = None


def storage_root() -> Path:
    return Path(settings.DATA_DIR) / ATTACHMENTS_DIR


def absolute_path(attachment: Attachment) -> Path:
    return Path(settings.DATA_DIR) / attachment.path


def sniff_type(head: bytes) -> str | None:
    """The image type the first bytes announce, or None."""
    for magic, mime in _IMAGE_MAGIC:
        if head.startswith(magic):
            return mime
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return None


def text_type(name: str) -> str:
    """A text file's type by its name (for the agent only: it is always served as text/plain)."""
    guessed, _ = mimetypes.guess_type(name)
    if guessed and (guessed.startswith("text/") or guessed in _TEXT_LIKE) and guessed != "text/html":
        return guessed
    return TEXT_MIME


def clean_name(name: str) -> str:
    """A display name: the last path segment, without control characters, at most 255 characters."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    base = "".join(ch for ch in base if unicodedata.category(ch)[0] != "C").strip()
    return (base or "attachment")[:255]


def agent_takes_images(agent: str) -> bool | None:
    """Whether `agent` advertised image prompts to the runner that last started it; None: unknown.

    Runners record each agent's `initialize` summary at their heartbeat (runs.runner.agents).
    """
    for capabilities in Runner.objects.order_by("-heartbeat_at").values_list("agent_capabilities", flat=True):
        summary = (capabilities or {}).get(agent)
        if isinstance(summary, dict) and "prompt_capabilities" in summary:
            return bool((summary.get("prompt_capabilities") or {}).get("image"))
    return None


def do_upload_attachment(user: Any, session_id: int, upload: Upload) -> Attachment:
    """Store `upload` for the session `user` owns (else Session.DoesNotExist) and record it.

    Refused (AttachmentRefused): larger than HERMESWEB_ATTACHMENT_MAX_BYTES (413
    `attachment_too_large`); more than the owner's HERMESWEB_MAX_ATTACHMENT_BYTES_PER_USER with
    what they keep already (413 `attachment_quota_exceeded`); neither a known image nor UTF-8
    text, or an image the session's agent does not take (422 `unsupported_attachment`). Nothing
    is kept then.
    """
    session = Session.objects.visible_to(user).select_related("project").get(pk=session_id)
    limit = settings.HERMESWEB_ATTACHMENT_MAX_BYTES
    if upload.size is not None and upload.size > limit:
        raise too_large(limit)
    owner_id = session.project.owner_id
    if upload.size is not None:
        refuse_past_quota(owner_id, upload.size)  # before a byte is written; checked again below
    name = clean_name(upload.name)
    folder = storage_root() / f"u{session.project.owner_id}" / f"s{session.pk}"
    for level in (folder.parent.parent, folder.parent, folder):  # each owner-only, not just the last
        level.mkdir(mode=0o700, exist_ok=True)
    target = folder / secrets.token_hex(16)
    try:
        size, digest, mime = _write(target, upload.chunks, limit)
        if mime is None:
            mime = text_type(name)
        elif agent_takes_images(session.project.agent) is False:
            raise AttachmentRefused(
                422, "unsupported_attachment", f"The agent {session.project.agent!r} does not take images."
            )
        with transaction.atomic():
            # Uploads at once queue on the owner's row: each counts what the others kept.
            hold_owner(owner_id)
            refuse_past_quota(owner_id, size)
            return Attachment.objects.create(
                session=session,
                name=name,
                mime_type=mime,
                size=size,
                sha256=digest,
                path=str(target.relative_to(settings.DATA_DIR)),
            )
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        raise


def refuse_past_quota(owner_id: Any, size: int) -> None:
    """AttachmentRefused 413 `attachment_quota_exceeded` when `size` more bytes would take the
    owner's attachments, sent or not, past HERMESWEB_MAX_ATTACHMENT_BYTES_PER_USER."""
    quota = settings.HERMESWEB_MAX_ATTACHMENT_BYTES_PER_USER
    owned = Attachment.objects.filter(session__project__owner_id=owner_id)
    kept = owned.aggregate(total=Sum("size"))["total"] or 0
    if kept + size > quota:
        raise AttachmentRefused(
            413,
            "attachment_quota_exceeded",
            f"Your attachments may hold at most {quota} bytes in all; delete sessions that hold some first.",
        )


def too_large(limit: int) -> AttachmentRefused:
    return AttachmentRefused(413, "attachment_too_large", f"An attachment may hold at most {limit} bytes.")


def _write(target: Path, chunks: Iterable[bytes], limit: int) -> tuple[int, str, str | None]:
    """Copy `chunks` to a new owner-only file: (size, sha256, image type or None for text)."""
    digest, size, head = hashlib.sha256(), 0, b""
    decoder = _Utf8Check()
    # O_EXCL | O_NOFOLLOW: a fresh random name, never written through a planted link.
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    with os.fdopen(fd, "wb") as handle:
        for chunk in chunks:
            size += len(chunk)
            if size > limit:
                raise too_large(limit)
            if len(head) < 16:
                head = (head + chunk)[:16]
            digest.update(chunk)
            decoder.feed(chunk)
            handle.write(chunk)
    image = sniff_type(head)
    if image is None and (size == 0 or not decoder.finish()):
        message = "Only images (PNG, JPEG, GIF, WebP) and UTF-8 text files can be attached."
        raise AttachmentRefused(422, "unsupported_attachment", message)
    return size, digest.hexdigest(), image


class _Utf8Check:
    """Whether a stream of chunks is valid UTF-8 without NUL, decoded incrementally."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self.valid = True

    def feed(self, chunk: bytes) -> None:
        if not self.valid:
            return
        try:
            self._decoder.decode(chunk)
        except UnicodeDecodeError:
            self.valid = False
        if b"\x00" in chunk:
            self.valid = False

    def finish(self) -> bool:
        if self.valid:
            try:
                self._decoder.decode(b"", final=True)
            except UnicodeDecodeError:
                self.valid = False
        return self.valid


def owned_attachment(user: Any, attachment_id: int) -> Attachment:
    """The attachment, if `user` owns its session's project (else Attachment.DoesNotExist)."""
    return Attachment.objects.get(pk=attachment_id, session__project__owner=user)


def describe_for_message(user: Any, session_id: int, ids: Sequence[int]) -> list[dict[str, Any]]:
    """The stored form ({id, name, mime_type, size}) of `ids`, in their order, for a message.

    Each must be an upload of that session, which `user` owns: else Attachment.DoesNotExist.
    Each is marked sent first, so remove_unsent keeps it; one it removed meanwhile is not found.
    """
    wanted = list(dict.fromkeys(ids))
    mine = Attachment.objects.filter(pk__in=wanted, session_id=session_id, session__project__owner=user)
    mine.filter(sent_at__isnull=True).update(sent_at=timezone.now())
    found = {attachment.pk: attachment for attachment in mine}
    if len(found) != len(wanted):
        raise Attachment.DoesNotExist("No such attachment.")
    return [found[pk].described() for pk in wanted]


def unsent_before(older_than: timedelta | None = None) -> Any:
    """Uploads no message named, made before `older_than` (HERMESWEB_UNSENT_ATTACHMENT_HOURS) ago."""
    if older_than is None:
        older_than = timedelta(hours=settings.HERMESWEB_UNSENT_ATTACHMENT_HOURS)
    return Attachment.objects.filter(sent_at__isnull=True, created_at__lt=timezone.now() - older_than)


def remove_unsent(older_than: timedelta | None = None, *, batch: int = 500) -> int:
    """Delete the uploads no message named within `older_than` (a day), files too; how many.

    The runners call it in their housekeeping, and the `remove_unsent_attachments` command. The
    rows are locked while they go (PostgreSQL; SQLite's write lock does the same), so a message
    naming one at that moment either marks it sent first, and it stays, or finds it gone (404).
    """
    removed = 0
    while True:
        with transaction.atomic():
            rows = list(
                unsent_before(older_than)
                .select_for_update()
                .order_by("pk")
                .values_list("pk", flat=True)[:batch]
            )
            # post_delete removes each file once this commits.
            Attachment.objects.filter(pk__in=rows).delete()
        removed += len(rows)
        if len(rows) < batch:
            return removed


@receiver(post_delete, sender=Attachment, dispatch_uid="runs.attachments.remove_file")
def remove_file(sender: type[Attachment], instance: Attachment, **kwargs: Any) -> None:
    """The file goes with its row (a session's or project's deletion cascades here), once committed."""
    path = absolute_path(instance)

    def unlink() -> None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        with contextlib.suppress(OSError):  # the session's folder, once empty
            path.parent.rmdir()

    transaction.on_commit(unlink)
