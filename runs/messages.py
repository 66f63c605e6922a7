"""A user's message on its way in: one value from `runs.services` to a new turn or an intent.

Its own module, beside none of its users, so that `runs.services` and `intents.services`
(which the former imports) both take it without an import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runs.models import RunSource


@dataclass(frozen=True)
class NewMessage:
    """What a user sent, as runs.services decides it: a new turn (Run) or a pending intent.

    `attachments` are described uploads, `{id, name, mime_type, size}`, as a turn or an intent
    stores them; `mode` decides only while a run is active (docs/intents.md).
    """

    client_id: str  # client-generated: the same id on one session is the same message
    text: str
    mode: str = "auto"  # "auto" (the project's running_default), "queue" or "steer"
    attachments: tuple[dict[str, Any], ...] = ()
    source: str = RunSource.COMPOSER
    source_meta: dict[str, Any] = field(default_factory=dict)
