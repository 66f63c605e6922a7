"""What the runner writes to Session rows: the agent's session id, title, commands, modes and models.

Design note: docs/runner.md ("Agent processes", "Translation"). Each write rings the
session's viewers (`session.changed`). Updates that may be done twice: the execution
retries them through an outage (`connections.retried`).
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from projects.models import Session
from runs import notify
from runs.redaction import redact, redact_text


def store_agent_session(session_id: int, agent_session_id: str) -> None:
    """The agent session `session/new` opened for this session."""
    Session.objects.filter(pk=session_id).update(agent_session_id=agent_session_id, updated_at=timezone.now())
    notify.publish_session_changed(session_id)


def store_forked_session(session_id: int, agent_session_id: str) -> None:
    """The agent session `session/fork` made for this forked session: the fork is done."""
    Session.objects.filter(pk=session_id).update(
        agent_session_id=agent_session_id, fork_agent_session_id="", updated_at=timezone.now()
    )
    notify.publish_session_changed(session_id)


def store_agent_config(
    session_id: int,
    modes: list[dict[str, str]],
    models: list[dict[str, str]],
    current_mode: str,
    current_model: str,
) -> None:
    """The modes and models the agent reported; its current ones where the user chose none."""
    sessions = Session.objects.filter(pk=session_id)
    sessions.update(available_modes=modes, available_models=models)
    if current_mode:
        sessions.filter(mode="").update(mode=current_mode)
    if current_model:
        sessions.filter(model="").update(model=current_model)
    notify.publish_session_changed(session_id)


def store_current_mode(session_id: int, mode: str) -> None:
    """A mode the agent switched to by itself (`current_mode_update`): the session's mode now.

    Called inside a journal batch's transaction (runs/runner/execution.py): rings on commit.
    """
    Session.objects.filter(pk=session_id).update(mode=mode)
    notify.publish_on_commit(notify.publish_session_changed, session_id)


def store_session_meta(session_id: int, title: str | None, commands: list[dict[str, Any]] | None) -> None:
    """The agent's title (if the user has not named the session) and its commands (if given).

    Both are the agent's words, redacted as the journal's are.
    """
    fields: dict[str, Any] = {}
    if commands is not None:
        fields["commands"] = redact(commands)
    if title:
        Session.objects.filter(pk=session_id, title="").update(title=redact_text(title))
    if fields:
        Session.objects.filter(pk=session_id).update(**fields)
    notify.publish_session_changed(session_id)


def store_between_turns(
    agent_session_id: str, title: str | None, commands: list[dict[str, Any]] | None
) -> None:
    """A title or commands an agent sent after its turn ended, for every session on that agent session."""
    for session_id in Session.objects.filter(agent_session_id=agent_session_id).values_list("pk", flat=True):
        store_session_meta(session_id, title, commands)
