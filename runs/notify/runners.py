"""The runners' doorbell: PostgreSQL's NOTIFY inside the writing transaction, else the channel layer.

On PostgreSQL the notification is part of the transaction that wrote the work, so it goes out
at that commit and never for a rollback (docs/runner.md, "Waking").
"""

from __future__ import annotations

from django.db import connection

from runs.notify.groups import RUNNERS_GROUP
from runs.notify.sending import publish_on_commit, send

# PostgreSQL: the channel runners LISTEN on (runs.runner.process); payload "reason[:run id]".
RUNNERS_CHANNEL = "hermesweb_runners"


def runners_listen() -> bool:
    """Whether runners wake on the database's notifications (else on the channel layer)."""
    return connection.vendor == "postgresql"


def wake_runners(reason: str, run_id: int | None = None) -> None:
    """Ring the runners for what the caller wrote: at its transaction's commit, or now.

    Called inside the transaction that wrote the work, never in on_commit: on PostgreSQL
    it is a NOTIFY that PostgreSQL delivers at that commit, and only if it commits, with no
    thread hop or round trip of its own on the way to the first token.
    """
    if runners_listen():
        # The payload is for whoever watches the channel (psql's LISTEN); runners only wake.
        payload = reason if run_id is None else f"{reason}:{run_id}"
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [RUNNERS_CHANNEL, payload])
        return
    publish_on_commit(send, RUNNERS_GROUP, {"type": "runner.wake", "reason": reason, "run_id": run_id})
