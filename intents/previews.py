"""Open intents as lists show them: each text cut to a preview (docs/intents.md).

Below the API: the intents list (intents/api.py) and the transcript (runs/api.py) both answer
with these, so a queue looks the same whichever asked.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from intents.models import PendingIntent
from intents.schemas import IntentPreviewOut
from intents.services import intent_dict
from projects.models import Session

# A list's or the socket snapshot's cut of each intent's text (the whole one: GET /api/intents/{id}).
INTENT_PREVIEW_CHARS = 2000


def intent_preview(intent: PendingIntent, chars: int, *, meta: bool = True) -> dict[str, Any]:
    """intent_dict with the text cut to `chars` (`truncated`, `text_length` say so); `meta`: keep
    attachments and source_meta."""
    preview = intent_dict(intent)
    preview["text_length"] = len(intent.text)
    preview["truncated"] = len(intent.text) > chars
    preview["text"] = intent.text[:chars]
    if not meta:
        preview.update(attachments=[], source_meta={}, truncated=True)
    return preview


def previews(intents: Iterable[PendingIntent]) -> list[IntentPreviewOut]:
    """Intents as lists send them: each text cut as the socket's snapshot cuts it."""
    return [IntentPreviewOut.model_validate(intent_preview(i, INTENT_PREVIEW_CHARS)) for i in intents]


def open_previews(session: Session) -> list[IntentPreviewOut]:
    """The session's open intents in queue order, as previews (this list and the transcript's)."""
    return previews(PendingIntent.objects.filter(session=session).open().order_by("position", "id"))
