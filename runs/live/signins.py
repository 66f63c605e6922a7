"""The sign-ins of this process's sockets: a socket whose sign-in ended is closed with 4401.

Design note: docs/live-delivery.md ("Sign-in"), docs/security.md. Two ways in, both per process,
never per socket: the fast path is the user's doorbell (`notify.user_group`, rung after a logout,
a password change, a deactivation: hermesweb.auth's signals), and the safety net is one batched
re-check every `HERMESWEB_LIVE_SIGNIN_CHECK_SECONDS` (3 s) for what no signal sees (a
`QuerySet.update`, expiry, a change made without Redis in another process, a lost doorbell).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from channels.db import database_sync_to_async

from hermesweb.auth import StillSignedIn, session_tag, sign_in_facts, socket_user_now, still_signed_in
from runs import notify
from runs.event_loops import per_event_loop
from runs.live.doorbell import tuning
from runs.live.user_doorbell import UserDoorbell

log = logging.getLogger(__name__)


def check_seconds() -> float:
    return tuning("HERMESWEB_LIVE_SIGNIN_CHECK_SECONDS", 3.0)


class Watched:
    """One socket's sign-in, and how to close the socket when it ends."""

    __slots__ = ("facts", "scope", "signed_out", "tag", "user_id")  # one per open socket

    def __init__(self, scope: dict[str, Any], signed_out: Callable[[], Awaitable[None]]) -> None:
        self.scope = scope
        self.user_id = scope["user"].pk
        self.facts: StillSignedIn | None = sign_in_facts(scope)
        self.tag = session_tag(scope["session"].session_key)
        self.signed_out = signed_out


def ended(sockets: Iterable[Watched]) -> list[Watched]:
    """The sockets whose sign-in no longer stands (sync: run in a thread)."""
    sockets = list(sockets)
    holding = still_signed_in({s.facts for s in sockets if s.facts is not None})
    gone = [s for s in sockets if s.facts is not None and s.facts not in holding]
    # Another session engine: asked as Django's get_user would, a socket at a time.
    gone += [s for s in sockets if s.facts is None and socket_user_now(s.scope) is None]
    return gone


class SignInWatch:
    """This event loop's signed-in sockets, by user; one channel for the users' doorbells."""

    def __init__(self) -> None:
        self.by_user: dict[Any, set[Watched]] = {}
        self.doorbell = UserDoorbell(notify.user_group, self._rung, "sign-in")
        self._check_task: asyncio.Task[None] | None = None

    async def add(self, socket: Watched) -> None:
        if self._check_task is None:
            self._check_task = asyncio.ensure_future(self._check_loop())
        sockets = self.by_user.setdefault(socket.user_id, set())
        sockets.add(socket)
        if len(sockets) == 1:
            await self.doorbell.join(socket.user_id)

    async def remove(self, socket: Watched) -> None:
        sockets = self.by_user.get(socket.user_id)
        if sockets is None or socket not in sockets:
            return
        sockets.discard(socket)
        if not sockets:
            del self.by_user[socket.user_id]
            await self.doorbell.leave(socket.user_id)
        if not self.by_user:
            task, self._check_task = self._check_task, None
            if task is not None:
                task.cancel()
            self.doorbell.close()

    async def _rung(self, message: dict[str, Any]) -> None:
        sockets = tuple(self.by_user.get(message.get("user_id"), ()))
        tag = message.get("session_tag")
        if tag is not None:
            # Signed out: that session is being flushed as this arrives, so no need to ask.
            await self._close([s for s in sockets if s.tag == tag])
        elif sockets:
            await self._check(sockets)

    async def _check_loop(self) -> None:
        while True:
            await asyncio.sleep(check_seconds())
            sockets = [s for group in self.by_user.values() for s in group]
            if sockets:
                await self._check(sockets)

    async def _check(self, sockets: Iterable[Watched]) -> None:
        try:
            gone = await database_sync_to_async(ended)(list(sockets))
        except Exception:
            log.warning("sign-in re-check failed; trying again later", exc_info=True)
            return
        await self._close(gone)

    async def _close(self, sockets: Iterable[Watched]) -> None:
        for socket in sockets:
            with contextlib.suppress(Exception):
                await socket.signed_out()


get_watch = per_event_loop(SignInWatch)  # this event loop's SignInWatch
