"""The session socket `/ws/sessions/{id}/`: authenticate, parse each frame, hand it on, answer.

Design note: docs/live-delivery.md ("Protocol", "Layout"). Delivery is the Subscription's;
a submit is the API's own domain action (runs.services.do_submit_message_as), answered with
a `submitted` frame. Refusals close with application codes after the handshake, so a browser
can tell "sign in again" (4401) from "no such session" (4404).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from typing import Any, NamedTuple

from autobahn.exception import Disconnected
from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from django.db import InterfaceError, OperationalError

from hermesweb.auth import read_socket_user, socket_sign_in, socket_user_now
from hermesweb.errors import database_unavailable_body
from projects.models import Session
from projects.refusals import Refused
from runs import services
from runs.event_loops import per_event_loop
from runs.live.doorbell import tuning
from runs.live.feed import SessionGone
from runs.live.outflow import Outflow, TooSlow, watch
from runs.live.protocol import (
    HEARTBEAT,
    PONG,
    BadRequest,
    InvalidSubmit,
    Ping,
    Submit,
    WatchSessions,
    error_frame,
    parse_client_message,
    refusal_frame,
    refused_frame,
    submitted_frame,
)
from runs.live.reads import can_view, pooled
from runs.live.signins import Watched, get_watch
from runs.live.socket_quota import claim, get_quota
from runs.live.subscription import Subscription
from runs.live.user_feed import get_user_hub
from runs.schemas import SubmitOut

log = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401
CLOSE_NOT_FOUND = 4404
# The client did not read what was sent (runs.live.outflow): it reconnects with its cursors.
CLOSE_TOO_SLOW = 4008
# Not 1011: autobahn (under daphne) refuses any close code an application sends but 1000 and
# 3000-4999, so 1011 only ever reached a client through daphne's "Exception inside application".
CLOSE_INTERNAL_ERROR = 4500
# The user holds HERMESWEB_MAX_SOCKETS_PER_USER open sockets already, across every web process
# (runs.live.socket_quota): `too_many_sockets`. The browser retries with backoff, as for 4008.
CLOSE_TOO_MANY_SOCKETS = 4429


# Subscribes a socket may send: a burst of SUBSCRIBE_BURST, then SUBSCRIBE_PER_SECOND. Each one
# reads the database (cursors, snapshot, replay); a browser sends one per socket, and again
# only after a cursor error. Past the limit: a `rate_limited` error frame, the socket stays open.
SUBSCRIBE_BURST = 10
SUBSCRIBE_PER_SECOND = 1.0


class TokenBucket:
    def __init__(self, burst: float, per_second: float) -> None:
        self.burst, self.per_second = burst, per_second
        self.tokens = burst
        self.at = time.monotonic()

    def take(self) -> float:
        """0 if a token was taken, else the seconds until one is there."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.per_second)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.per_second


def heartbeat_seconds() -> float:
    return tuning("HERMESWEB_LIVE_HEARTBEAT_SECONDS", 15.0)


class Heartbeats:
    """This event loop's sockets, sent a heartbeat every `heartbeat_seconds()` by one timer.

    A task per socket (its frame, its sleep's timer) was ~1.7 KiB of every idle socket
    (bench/idle_sockets.py); one pass over a set costs a few bytes each. A socket's gap
    between heartbeats stays at most the interval.
    """

    def __init__(self) -> None:
        self.sockets: set[SessionConsumer] = set()
        self.task: asyncio.Task[None] | None = None

    def add(self, socket: SessionConsumer) -> None:
        self.sockets.add(socket)
        if self.task is None:
            self.task = asyncio.ensure_future(self._beat())

    def remove(self, socket: SessionConsumer) -> None:
        self.sockets.discard(socket)
        if not self.sockets and self.task is not None:
            task, self.task = self.task, None
            task.cancel()

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(heartbeat_seconds())
            for socket in list(self.sockets):
                try:
                    await socket.send(text_data=HEARTBEAT)
                except Exception:
                    # A closing socket: its disconnect removes it; the others still beat.
                    log.debug("heartbeat not sent", exc_info=True)


get_heartbeats = per_event_loop(Heartbeats)  # this event loop's Heartbeats


class Admission(enum.IntEnum):
    """What an accepted socket's first read says: go on, or the close code."""

    ADMITTED = 0
    UNAUTHENTICATED = CLOSE_UNAUTHENTICATED
    NOT_FOUND = CLOSE_NOT_FOUND
    TOO_MANY_SOCKETS = CLOSE_TOO_MANY_SOCKETS


class Admitted(NamedTuple):
    admission: Admission
    row: int | None = None  # the socket's row in the user's count (runs.live.socket_quota)


def admit(scope: dict[str, Any], session_id: int | None) -> Admitted:
    """Read the socket's user and, for a session socket, whether it may see the session; then
    count the socket against the user's cap.

    Sync, one hop to the loop's pool for all of it (runs.live.reads.pooled): on the thread
    database_sync_to_async shares, a storm's handshakes queued behind each other.
    """
    user = read_socket_user(scope)
    if not user.is_authenticated:
        return Admitted(Admission.UNAUTHENTICATED)
    if session_id is not None and not can_view(user, session_id):
        return Admitted(Admission.NOT_FOUND)
    row = claim(user.pk)
    if row is None:
        return Admitted(Admission.TOO_MANY_SOCKETS)
    return Admitted(Admission.ADMITTED, row)


class SubmitAnswer(NamedTuple):
    frame: str  # the `submitted` frame
    signed_out: bool  # the socket's sign-in is gone: close it with 4401 after sending the frame


def answer_submit(scope: dict[str, Any], session_id: int, submit: Submit) -> SubmitAnswer:
    """A socket's submit, done as `POST /api/sessions/{id}/messages` does it (sync: run in a thread).

    The sign-in is asked again, as an HTTP request would: where it can be, by the statement
    that writes the turn (hermesweb.auth.StillSignedIn).
    """
    try:
        return _answer_submit(scope, session_id, submit)
    except (OperationalError, InterfaceError) as exc:
        # As the API's 503: the client's retry carries the same client id, so it is never a second turn.
        log.warning("session %s: a socket submit found the database unavailable: %s", session_id, exc)
        return SubmitAnswer(
            refused_frame(submit.message.client_id, 503, **database_unavailable_body()), False
        )


def _answer_submit(scope: dict[str, Any], session_id: int, submit: Submit) -> SubmitAnswer:
    message = submit.message
    client_id = message.client_id
    signed_out = SubmitAnswer(
        refused_frame(client_id, 401, "not_authenticated", "Signed out: sign in again to send."), True
    )
    guard = socket_sign_in(scope)
    user = scope["user"] if guard is not None else socket_user_now(scope)
    if user is None:
        return signed_out
    try:
        result = services.do_submit_message_as(
            user,
            session_id,
            client_id=client_id,
            text=message.text,
            mode=message.mode,
            attachments=message.attachments,
            mentions=message.mentions,
            guard=guard,
        )
    except services.GuardFailed:
        return signed_out
    except Session.DoesNotExist:
        return SubmitAnswer(refused_frame(client_id, 404, "not_found", "No such session."), False)
    except Refused as exc:
        return SubmitAnswer(refusal_frame(client_id, exc), False)
    return SubmitAnswer(submitted_frame(client_id, SubmitOut.from_result(result)), False)


class SessionConsumer(AsyncWebsocketConsumer):
    # No channel-layer alias resolves: a socket gets no channel of its own (with Redis,
    # that is no subscription per socket); its session's feed listens once per process.
    channel_layer_alias = "hermesweb-live-sockets-have-no-channel"

    session_id: int
    subscription: Subscription | None = None
    _subscription_task: asyncio.Task[None] | None = None
    _authorized = False
    _watched: Watched | None = None
    _subscribes: TokenBucket | None = None
    outflow: Outflow | None = None
    _too_slow_task: asyncio.Task[None] | None = None
    _watching_sessions = False
    _quota_row: int | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        # Channels' own waits on the client and on the consumer's channel together, with
        # asyncio.wait and a task per frame; a socket here has no channel (channel_layer_alias),
        # so one await does: ~2 KiB less per open socket (bench/idle_sockets.py), a task less per frame.
        self.scope = scope
        self.channel_layer = None
        self.base_send = send
        with contextlib.suppress(StopConsumer):
            while True:
                await self.dispatch(await receive())

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels' own first hops to its one database thread to close old connections, once per
        # frame; every read here runs through database_sync_to_async, which does that itself. In
        # a storm of 200 reconnects that hop queued behind the others and held every handshake
        # past daphne's 5 s (docs/reliability.md, reconnect storm).
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def websocket_disconnect(self, message: dict[str, Any]) -> None:
        # Channels' own also hops to its one database thread to close old connections (see
        # dispatch) and discards groups (a socket here has none): a storm's 200 closes queued there.
        await self.disconnect(message["code"])
        raise StopConsumer

    async def connect(self) -> None:
        self.session_id = int(self.scope["url_route"]["kwargs"]["session_id"])
        # Accept first: a refused handshake reaches the browser as a bare 1006 with no reason,
        # and daphne's handshake timeout then covers no database read (SocketSessionMiddleware).
        await self.accept()
        if not await self._admit(self.session_id):
            return
        self.outflow = watch(self.base_send)
        # Closed with 4401 within seconds of a logout, password change or deactivation.
        self._watched = Watched(self.scope, self._signed_out)
        await get_watch().add(self._watched)
        get_heartbeats().add(self)

    async def _admit(self, session_id: int | None) -> bool:
        admitted = await pooled(admit)(self.scope, session_id)
        if admitted.row is None:  # refused: only an admitted socket holds a row
            await self.close(code=admitted.admission.value)
            return False
        self._quota_row = admitted.row  # given back in disconnect, whatever ends the socket
        get_quota().add(admitted.row)
        self._authorized = True
        return True

    async def _signed_out(self) -> None:
        self._authorized = False
        await self._stop_subscription()
        await self.close(code=CLOSE_UNAUTHENTICATED)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if not self._authorized:
            return
        try:
            message = parse_client_message(text_data)
        except InvalidSubmit as exc:
            await self.send(text_data=exc.frame())
            return
        except BadRequest as exc:
            await self.send(text_data=error_frame(exc.code, str(exc)))
            return
        if isinstance(message, Ping):
            await self.send(text_data=PONG)
            return
        if isinstance(message, Submit):
            await self._submit(message)
            return
        if isinstance(message, WatchSessions):
            await self._watch_sessions()
            return
        if self._subscribes is None:
            self._subscribes = TokenBucket(SUBSCRIBE_BURST, SUBSCRIBE_PER_SECOND)
        wait = self._subscribes.take()
        if wait:
            # Refused before any work; the subscription in place, if any, goes on.
            message_text = "Too many subscribe frames: send it again later."
            await self.send(text_data=error_frame("rate_limited", message_text, retry_after=round(wait, 2)))
            return
        # A new subscribe replaces the previous one: its cursors are the client's truth now.
        await self._stop_subscription()
        self.subscription = Subscription(self.session_id, message.after, self._send_text, self.outflow)
        self._subscription_task = asyncio.ensure_future(self._follow(self.subscription))

    async def _submit(self, message: Submit) -> None:
        try:
            answer = await database_sync_to_async(answer_submit)(self.scope, self.session_id, message)
        except Exception:
            # Nothing was lost: the client id makes the client's retry (over HTTP) the same message.
            log.exception("session %s: submit over the socket failed", self.session_id)
            frame = refused_frame(message.message.client_id, 500, "internal_error", "The server failed.")
            answer = SubmitAnswer(frame, False)
        await self.send(text_data=answer.frame)
        if answer.signed_out:
            await self.close(code=CLOSE_UNAUTHENTICATED)

    async def _watch_sessions(self) -> None:
        # Once per socket: the first answer is a snapshot, then changes (runs.live.user_feed).
        if not self._watching_sessions:
            self._watching_sessions = True
            await get_user_hub().join(self.scope["user"].pk, self._send_text)

    async def disconnect(self, code: int) -> None:
        try:
            if self._watching_sessions:
                await get_user_hub().leave(self.scope["user"].pk, self._send_text)
            get_heartbeats().remove(self)
            if self._watched is not None:
                await get_watch().remove(self._watched)
            await self._stop_subscription()
        finally:
            row, self._quota_row = self._quota_row, None
            if row is not None:
                await get_quota().release(row)

    async def _send_text(self, frame: str) -> None:
        await self.send(text_data=frame)

    async def send(
        self, text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False
    ) -> None:
        outflow = self.outflow
        # Straight to the socket when nothing is queued ahead (runs.live.outflow): per socket and
        # frame, Channels, daphne, autobahn and Twisted's write buffer were most of a fan-out's cost.
        if outflow is not None and text_data is not None and not close and outflow.write_text(text_data):
            return
        await super().send(text_data=text_data, bytes_data=bytes_data, close=close)
        # Counted only while the transport holds a backlog: the encode is then worth it.
        if outflow is None or not outflow.paused or text_data is None:
            return
        if not outflow.sent(len(text_data.encode())) and self._too_slow_task is None:
            self._too_slow_task = asyncio.ensure_future(self._too_slow(outflow.too_slow or ""))

    async def _too_slow(self, reason: str) -> None:
        log.warning("session %s: the client does not read (%s): closing with 4008", self.session_id, reason)
        self._authorized = False
        await self._stop_subscription()
        await self.close(code=CLOSE_TOO_SLOW)

    async def _follow(self, subscription: Subscription) -> None:
        try:
            await subscription.run()
        except asyncio.CancelledError:
            raise
        except SessionGone:
            await self.close(code=CLOSE_NOT_FOUND)
        except TooSlow as exc:
            log.warning("session %s: the client does not read (%s): closing with 4008", self.session_id, exc)
            self._authorized = False
            await self.close(code=CLOSE_TOO_SLOW)
        except Disconnected:
            # The client went away mid-send (a tab closed during its catch-up): its disconnect follows.
            log.info("session %s: the client left during a send", self.session_id)
        except Exception:
            # The client reconnects with its cursors: nothing is lost, the journal has it all.
            log.exception("session %s: live subscription failed", self.session_id)
            with contextlib.suppress(Disconnected):
                await self.close(code=CLOSE_INTERNAL_ERROR)

    async def _stop_subscription(self) -> None:
        task, self._subscription_task = self._subscription_task, None
        self.subscription = None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class LiveConsumer(SessionConsumer):
    """`/ws/live/`: a page with no session open (a project, the home page) follows only the
    user's sessions' states (`sessions` frames), with pings; the session socket does it too."""

    async def connect(self) -> None:
        await self.accept()
        if not await self._admit(None):
            return
        self._watched = Watched(self.scope, self._signed_out)
        await get_watch().add(self._watched)
        get_heartbeats().add(self)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if not self._authorized:
            return
        try:
            message = parse_client_message(text_data)
        except BadRequest as exc:
            await self.send(text_data=error_frame(exc.code, str(exc)))
            return
        if isinstance(message, Ping):
            await self.send(text_data=PONG)
        elif isinstance(message, WatchSessions):
            await self._watch_sessions()
        else:
            no_session = "This socket has no session: open /ws/sessions/<id>/."
            await self.send(text_data=error_frame("bad_request", no_session))
