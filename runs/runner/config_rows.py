"""What the runner reads and writes of a session's config options (projects/session_options.py).

Each write rings the session's viewers (`session.changed`); both may be retried through an
outage (`connections.retried`): a write stores the same list again, a read changes nothing.
"""

from __future__ import annotations

from typing import Any

from projects.models import Session
from runs import notify
from runs.redaction import redact


def store_config_options(session_id: int, options: list[dict[str, Any]]) -> None:
    """The config options the agent reported for the session (its words: redacted like the journal)."""
    Session.objects.filter(pk=session_id).update(config_options=redact(options))
    notify.publish_session_changed(session_id)


def read_config_choices(session_id: int) -> dict[str, Any]:
    """The user's config choices for the session, as they are now."""
    found = Session.objects.filter(pk=session_id).values_list("config", flat=True).first()
    return found if isinstance(found, dict) else {}
