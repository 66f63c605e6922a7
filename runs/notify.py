"""The doorbell: channel-layer notifications, sent after commit.

Delivery is at-least-once at best (at-most-once by Channels' own spec), so
nothing relies on it for correctness: consumers repair seq gaps from the
database and the runner re-reads pending controls on a timer.
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

log = logging.getLogger(__name__)

RUNNERS_GROUP = "runners"
# Events ride along in the notification while small, so N sockets of one web
# process do not each query the database; larger batches send only the cursor.
INLINE_EVENTS_MAX = 200


def session_group(session_id: int) -> str:
    return f"session.{session_id}"


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


def _send(group: str, message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, message)
    except Exception:  # the doorbell failing must never fail the write that rang it
        log.warning("channel layer publish to %s failed", group, exc_info=True)


async def _asend(group: str, message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await layer.group_send(group, message)
    except Exception:
        log.warning("channel layer publish to %s failed", group, exc_info=True)


def publish_events(session_id: int, run_id: int, envelopes: list[dict[str, Any]]) -> None:
    _send(session_group(session_id), run_events_message(session_id, run_id, envelopes))


async def apublish_events(session_id: int, run_id: int, envelopes: list[dict[str, Any]]) -> None:
    await _asend(session_group(session_id), run_events_message(session_id, run_id, envelopes))


def publish_session_changed(session_id: int) -> None:
    _send(session_group(session_id), {"type": "session.changed", "session_id": session_id})


def wake_runners(reason: str, run_id: int | None = None) -> None:
    _send(RUNNERS_GROUP, {"type": "runner.wake", "reason": reason, "run_id": run_id})
