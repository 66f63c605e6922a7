"""The channel layer's group names, and the journal's notification as it rides on them.

Design note: docs/live-delivery.md. No database, no channel layer: names and shapes only.
"""

from __future__ import annotations

from typing import Any

RUNNERS_GROUP = "runners"
# Runners' journal notifications for every session (apublish_many); web processes listen once.
JOURNAL_GROUP = "journal"
# Owner changes: every process drops its cached owners (runs.notify.owners).
OWNERS_GROUP = "owners"
# Where the health probe publishes while the layer is down (runs.notify.layer_health).
PROBE_GROUP = "hermesweb.probe"
# Events ride along in the notification while small, so N sockets of one web
# process do not each query the database; larger batches send only the cursor.
INLINE_EVENTS_MAX = 200


def session_group(session_id: int) -> str:
    return f"session.{session_id}"


def user_group(user_id: Any) -> str:
    """A user's sign-in doorbell: each web process listens for the users its sockets serve."""
    return f"user.{user_id}"


def user_sessions_group(user_id: Any) -> str:
    """A user's sessions doorbell: any of their sessions changed its live state (runs.live.user_feed)."""
    return f"user.{user_id}.sessions"


def run_events_message(session_id: int, run_id: int, envelopes: list[dict[str, Any]]) -> dict[str, Any]:
    last_seq = envelopes[-1]["seq"] if envelopes else 0
    message: dict[str, Any] = {
        "type": "run.events",
        "session_id": session_id,
        "run_id": run_id,
        "last_seq": last_seq,
    }
    if len(envelopes) <= INLINE_EVENTS_MAX:
        message["events"] = envelopes
    return message
