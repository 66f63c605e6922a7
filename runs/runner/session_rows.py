"""What the runner writes to Session rows: the agent's session id, title and commands.

Design note: docs/runner.md ("Agent processes", "Translation"). Each write rings the
session's viewers (`session.changed`). Updates that may be done twice: the execution
retries them through an outage (`connections.retried`).
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from projects.models import Session
from runs import notify


def store_agent_session(session_id: int, agent_session_id: str) -> None:
    """The agent session `session/new` opened for this session."""
    Session.objects.filter(pk=session_id).update(agent_session_id=agent_session_id, updated_at=timezone.now())
    notify.publish_session_changed(session_id)


def store_session_meta(session_id: int, title: str | None, commands: list[dict[str, Any]] | None) -> None:
    """The agent's title (if the user has not named the session) and its commands (if given)."""
    fields: dict[str, Any] = {}
    if commands is not None:
        fields["commands"] = commands
    if title:
        Session.objects.filter(pk=session_id, title="").update(title=title)
    if fields:
        Session.objects.filter(pk=session_id).update(**fields)
    notify.publish_session_changed(session_id)


def store_between_turns(
    agent_session_id: str, title: str | None, commands: list[dict[str, Any]] | None
) -> None:
    """A title or commands an agent sent after its turn ended, for every session on that agent session."""
    for session_id in Session.objects.filter(agent_session_id=agent_session_id).values_list("pk", flat=True):
        store_session_meta(session_id, title, commands)
