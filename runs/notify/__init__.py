"""The doorbells: channel-layer notifications sent after commit, and the runners' one.

Delivery is at-least-once at best (at-most-once by Channels' own spec), so
nothing relies on it for correctness: consumers repair seq gaps from the
database and the runner re-reads pending controls on a timer.

This package's face: the publishes below, and from its modules `groups` (the group names and
the journal's message), `layer_health` (the layer as publishes find it, the awaited send, the probe),
`sending` (synchronous code's sends, `publish_on_commit`), `owners` (sessions' owners cached
per process) and `runners` (the runners' doorbell, PostgreSQL's NOTIFY).
"""

from __future__ import annotations

import logging
from typing import Any

from runs.notify.groups import (
    INLINE_EVENTS_MAX,
    JOURNAL_GROUP,
    OWNERS_GROUP,
    PROBE_GROUP,
    RUNNERS_GROUP,
    run_events_message,
    session_group,
    user_group,
    user_sessions_group,
)
from runs.notify.layer_health import PUBLISH_TIMEOUT_SECONDS, asend, health, probe
from runs.notify.owners import (
    cached_owners,
    forget_owners,
    owner_cache,
    remember_owner,
    session_owners,
)
from runs.notify.runners import RUNNERS_CHANNEL, runners_listen, wake_runners
from runs.notify.sending import publish_on_commit, send

__all__ = [
    "INLINE_EVENTS_MAX",
    "JOURNAL_GROUP",
    "OWNERS_GROUP",
    "PROBE_GROUP",
    "PUBLISH_TIMEOUT_SECONDS",
    "RUNNERS_CHANNEL",
    "RUNNERS_GROUP",
    "apublish_events",
    "apublish_many",
    "apublish_user_sessions_changed",
    "cached_owners",
    "forget_owners",
    "health",
    "owner_cache",
    "probe",
    "publish_events",
    "publish_on_commit",
    "publish_session_changed",
    "publish_sign_in_changed",
    "publish_user_sessions_changed",
    "remember_owner",
    "run_events_message",
    "runners_listen",
    "session_group",
    "session_owners",
    "user_group",
    "user_sessions_group",
    "wake_runners",
]

log = logging.getLogger(__name__)


def publish_user_sessions_changed(user_id: Any) -> None:
    """After commit: the owner's sockets read all their sessions' states again."""
    send(user_sessions_group(user_id), {"type": "user.sessions", "user_id": user_id})


async def apublish_user_sessions_changed(user_ids: set[Any]) -> None:
    for user_id in user_ids:
        await asend(user_sessions_group(user_id), {"type": "user.sessions", "user_id": user_id})


def publish_sign_in_changed(user_id: Any, session_tag: str | None = None) -> None:
    """After commit: `session_tag` (runs.live.signins.session_tag) signed out, or, without one,
    the user's password, activity or staff flag changed: their sockets check again."""
    send(user_group(user_id), {"type": "signin.changed", "user_id": user_id, "session_tag": session_tag})


def publish_events(session_id: int, run_id: int, envelopes: list[dict[str, Any]]) -> None:
    send(session_group(session_id), run_events_message(session_id, run_id, envelopes))


async def apublish_events(session_id: int, run_id: int, envelopes: list[dict[str, Any]]) -> None:
    await asend(session_group(session_id), run_events_message(session_id, run_id, envelopes))


async def apublish_many(batches: list[tuple[int, int, list[dict[str, Any]]]]) -> None:
    """Several runs' notifications (session id, run id, envelopes) as one message.

    To JOURNAL_GROUP, which each web process listens to once (runs.live.feed.LiveHub): a runner
    holding a hundred runs commits them in groups, and one message per group instead of
    one per run per flush spares both sides thousands of Redis round trips and parses a
    second.
    """
    if batches:
        runs = [run_events_message(s, r, e) for s, r, e in batches]
        await asend(JOURNAL_GROUP, {"type": "journal.events", "runs": runs})


def publish_session_changed(session_id: int, owner_id: Any = None) -> None:
    """After commit: the session's viewers read its snapshot again, and its owner's sidebar states.

    `owner_id`, when the caller knows it, spares the owner's lookup (a turn's one statement).
    """
    send(session_group(session_id), {"type": "session.changed", "session_id": session_id})
    if owner_id is not None:
        remember_owner(session_id, owner_id)
    try:
        owners = session_owners({session_id})
    except Exception:  # the doorbell failing must never fail the write that rang it
        log.warning("session %s: its owner's doorbell was not rung", session_id, exc_info=True)
        return
    for owner in owners:
        publish_user_sessions_changed(owner)
