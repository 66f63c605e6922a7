"""The session socket: `/ws/sessions/{id}/` (protocol and design: docs/live-delivery.md).

Thin: it authenticates, parses frames, answers pings and hands submits to
runs.live.answer_submit; runs.live does the delivery. Refusals close with
application codes after the handshake, so a browser can tell "sign in again"
(4401) from "no such session" (4404).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from runs import live

log = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404
CLOSE_INTERNAL_ERROR = 1011


class SessionConsumer(AsyncWebsocketConsumer):
    # No channel-layer alias resolves: a socket gets no channel of its own (with Redis,
    # that is no subscription per socket); its session's feed listens once per process.
    channel_layer_alias = "hermesweb-live-sockets-have-no-channel"

    session_id: int
    subscription: live.Subscription | None = None
    _subscription_task: asyncio.Task[None] | None = None
    _heartbeat_task: asyncio.Task[None] | None = None
    _authorized = False

    async def connect(self) -> None:
        self.session_id = int(self.scope["url_route"]["kwargs"]["session_id"])
        user: Any = self.scope.get("user")
        # Accept first: a refused handshake reaches the browser as a bare 1006 with no reason.
        await self.accept()
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_UNAUTHENTICATED)
            return
        if not await database_sync_to_async(live.can_view)(user, self.session_id):
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self._authorized = True
        self._heartbeat_task = asyncio.ensure_future(self._heartbeat())

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if not self._authorized:
            return
        try:
            message = live.parse_client_message(text_data)
        except live.InvalidSubmit as exc:
            refusal = live.refused_frame(exc.client_id, 422, exc.code, str(exc), details=exc.details)
            await self.send(text_data=refusal)
            return
        except live.BadRequest as exc:
            await self.send(text_data=live.error_frame(exc.code, str(exc)))
            return
        if isinstance(message, live.Ping):
            await self.send(text_data=live.PONG)
            return
        if isinstance(message, live.Submit):
            await self._submit(message)
            return
        # A new subscribe replaces the previous one: its cursors are the client's truth now.
        await self._stop_subscription()
        self.subscription = live.Subscription(self.session_id, message.after, self._send_text)
        self._subscription_task = asyncio.ensure_future(self._follow(self.subscription))

    async def _submit(self, message: live.Submit) -> None:
        try:
            frame, signed_out = await database_sync_to_async(live.answer_submit)(
                self.scope, self.session_id, message
            )
        except Exception:
            # Nothing was lost: the client id makes the client's retry (over HTTP) the same message.
            log.exception("session %s: submit over the socket failed", self.session_id)
            frame, signed_out = (
                live.refused_frame(message.message.client_id, 500, "internal_error", "The server failed."),
                False,
            )
        await self.send(text_data=frame)
        if signed_out:
            await self.close(code=CLOSE_UNAUTHENTICATED)

    async def disconnect(self, code: int) -> None:
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
        await self._stop_subscription()

    async def _send_text(self, frame: str) -> None:
        await self.send(text_data=frame)

    async def _follow(self, subscription: live.Subscription) -> None:
        try:
            await subscription.run()
        except asyncio.CancelledError:
            raise
        except live.SessionGone:
            await self.close(code=CLOSE_NOT_FOUND)
        except Exception:
            # The client reconnects with its cursors: nothing is lost, the journal has it all.
            log.exception("session %s: live subscription failed", self.session_id)
            await self.close(code=CLOSE_INTERNAL_ERROR)

    async def _stop_subscription(self) -> None:
        task, self._subscription_task = self._subscription_task, None
        self.subscription = None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(live.heartbeat_seconds())
            await self.send(text_data=live.HEARTBEAT)
