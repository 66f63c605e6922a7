"""Warm-up requests from the web: a session's page was opened or typed in, so a turn may follow.

Design note: docs/runner.md ("Warm-up and memory"). Starting an agent (spawn, `initialize`,
`session/load`) is what the first turn after an idle period waits for; asked for when the
user arrives, it is done by the time they press Enter.

A request is a hint, kept cheap: at most one per session per HERMESWEB_WARM_INTERVAL_SECONDS
from this process (remembered here, no query), one row per session (`WarmRequest`, written
again in place), and the runners' doorbell rung in the same transaction. The row is what
reaches a runner without Redis (its poll reads it); a runner takes it by deleting it, and one
older than `runs.runner.warm.WARM_TTL_SECONDS` is dropped unread. A turn never waits for it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from projects.models import ProjectStatus, Session, SessionStatus
from runs import notify
from runs.models import WarmRequest

WarmReason = Literal["requested", "recent", "busy", "archived"]

# Sessions remembered per process for the interval; the oldest are forgotten past this many.
REMEMBERED_MAX = 10_000


@dataclass(frozen=True)
class WarmAnswer:
    """Whether a warm-up was asked of the runners, and if not, why not."""

    requested: bool
    reason: WarmReason


class RecentRequests:
    """When this process last asked for each session's warm-up (monotonic), bounded."""

    def __init__(self, limit: int = REMEMBERED_MAX) -> None:
        self.limit = limit
        self._at: OrderedDict[int, float] = OrderedDict()
        self._lock = threading.Lock()  # requests are served from several threads

    def first_in(self, session_id: int, interval: float) -> bool:
        """True (and remembered) unless `session_id` was asked for less than `interval` ago."""
        now = time.monotonic()
        with self._lock:
            last = self._at.get(session_id)
            if last is not None and now - last < interval:
                return False
            self._at[session_id] = now
            self._at.move_to_end(session_id)
            while len(self._at) > self.limit:
                self._at.popitem(last=False)
            return True

    def clear(self) -> None:
        with self._lock:
            self._at.clear()


recent_requests = RecentRequests()


def do_request_warm(session: Session) -> WarmAnswer:
    """Ask the runners to make `session`'s agent ready for its next turn.

    Preconditions: `session` is one the caller may see (the route's `get_visible`), with its
    project loaded. Answers without writing for an archived session or project, one asked for
    within the interval by this process (`recent`), or one with a turn under way (`busy`: that
    turn holds its agent already).
    """
    if session.status == SessionStatus.ARCHIVED or session.project.status == ProjectStatus.ARCHIVED:
        return WarmAnswer(False, "archived")
    if not recent_requests.first_in(session.pk, settings.HERMESWEB_WARM_INTERVAL_SECONDS):
        return WarmAnswer(False, "recent")
    if session.runs.active().exists():  # type: ignore[attr-defined]
        return WarmAnswer(False, "busy")
    with transaction.atomic():
        WarmRequest.objects.update_or_create(session_id=session.pk, defaults={"requested_at": timezone.now()})
        notify.wake_runners("warm", session.pk)
    return WarmAnswer(True, "requested")
