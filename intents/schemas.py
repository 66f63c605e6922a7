"""API shapes for pending intents (docs/intents.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from ninja import Field, Schema
from pydantic import Strict, StringConstraints

# PositiveIntegerField: PostgreSQL's integer.
MAX_INT = 2**31 - 1
# The largest value a bigint primary key can hold; larger ids cannot exist.
MAX_ID = 2**63 - 1

# Strict: a JSON `true` or "3" is not a number here (pydantic's lax mode would take them as 1 and 3).
BodyInt = Annotated[int, Strict()]
Version = Annotated[BodyInt, Field(ge=1, le=MAX_INT)]


class IntentOut(Schema):
    id: int
    session_id: int
    client_id: str
    kind: str
    state: str
    text: str
    attachments: list[Any]
    position: int
    version: int
    source: str
    source_meta: dict[str, Any]
    target_run_id: int | None
    run_id: int | None
    reason: str
    created_at: datetime
    updated_at: datetime


class IntentPreviewOut(IntentOut):
    """An intent in a list: its text cut as the socket's snapshot cuts it (docs/live-delivery.md)."""

    text: str = Field(
        description="The text's first 2,000 characters; when `truncated`, GET /api/intents/{id} has it all."
    )
    text_length: int = Field(description="The whole text's length, in characters.")
    truncated: bool = Field(description="Whether `text` is only the beginning of the text.")


class IntentPageOut(Schema):
    """GET /sessions/{id}/intents: the open queue whole, or (`include_closed`) a page of every intent."""

    intents: list[IntentPreviewOut]
    has_more: bool = Field(
        description="More intents follow this page (only with `include_closed`): "
        "ask again with `after=<after>`."
    )
    after: int | None = Field(description="The next page's cursor (this page's last id) when `has_more`.")


class IntentPatch(Schema):
    version: Version = Field(description="The version you last saw; a stale one is a 409 conflict.")
    # Blank text is a validation error: withdraw the item with DELETE instead.
    text: Annotated[str, StringConstraints(min_length=1, max_length=1_000_000, pattern=r"\S")] | None = None
    position: Annotated[BodyInt, Field(ge=0, le=MAX_INT)] | None = Field(
        None, description="New index among the session's waiting items (0 = next)."
    )


class IntentActionIn(Schema):
    run_id: Annotated[BodyInt, Field(ge=1, le=MAX_INT)] | None = Field(
        None, description="The run you saw running; if another run is active by now, the answer is 409."
    )


class IntentDeleteIn(Schema):
    version: Version | None = None


class IntentResultOut(Schema):
    status: str = Field(description="accepted | duplicate | not_active | expired | unsupported")
    message: str
    intent: IntentOut
