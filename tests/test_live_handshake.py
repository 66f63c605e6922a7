"""A socket's handshake is accepted before its sign-in is read; heartbeats come from one timer.

The reconnect storm (docs/reliability.md, gap 8): sign-in reads made before the accept queued
past daphne's handshake timeout. The consumer accepts first and reads the session and user in
the thread pool; until that read says yes it sends nothing. One timer per process beats every
socket (bench/idle_sockets.py: a task per socket was memory of every idle one).
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
from asgiref.sync import async_to_sync
from django.contrib.sessions.backends.db import SessionStore

from tests import factories
from tests.support.live import LiveStack, layer, live, session_cookie  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_socket_middleware_reads_no_session_before_the_consumer_accepts() -> None:
    from hermesweb.auth import SocketSessionMiddleware, read_socket_user

    user = factories.UserFactory()
    scope = {"type": "websocket", "cookies": {"sessionid": session_cookie(user)}}
    seen: dict[str, Any] = {}

    async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen["scope"] = scope

    loads = mock.patch.object(SessionStore, "load", autospec=True, side_effect=SessionStore.load)
    with loads as load:
        middleware = SocketSessionMiddleware(inner)
        async_to_sync(middleware)(scope, None, None)
        assert load.call_count == 0  # the handshake waited on no query
        assert read_socket_user(seen["scope"]) == user
        assert load.call_count == 1
    assert seen["scope"]["user"].pk == user.pk  # kept: the socket reads it once


@pytest.mark.parametrize("cookie", ["none", "stale"])
def test_a_socket_without_a_sign_in_gets_nothing_but_the_4401_close(live: LiveStack, cookie: str) -> None:
    live.start_daphne()
    session = factories.SessionFactory()
    socket = live.socket(session.pk, cookie=None if cookie == "none" else "no-such-session-key")
    assert socket.close_code() == 4401
    assert socket.frames == []


def test_heartbeats_go_on_for_the_sockets_left_open_and_start_again_for_new_ones(live: LiveStack) -> None:
    live.start_daphne(HERMESWEB_LIVE_HEARTBEAT_SECONDS="0.2")
    session = factories.SessionFactory()
    cookie = session_cookie(session.project.owner)
    first, second = live.socket(session.pk, cookie), live.socket(session.pk, cookie)
    for socket in (first, second):
        socket.until(lambda f: f["type"] == "heartbeat", timeout=10)
    first.close()
    for _ in range(2):
        second.until(lambda f: f["type"] == "heartbeat", timeout=10)
    second.close()
    # Every socket of the process closed (the timer stopped); a new one is beaten again.
    third = live.socket(session.pk, cookie)
    assert third.until(lambda f: f["type"] == "heartbeat", timeout=10)[-1] == {"type": "heartbeat"}


def test_every_close_code_the_consumer_sends_is_one_daphne_can_send() -> None:
    # autobahn refuses an application's close code outside 1000 and 3000-4999: a 1011 raised
    # inside daphne instead of closing (docs/live-delivery.md, the codes' table).
    from runs.live import consumer

    codes = {name: value for name, value in vars(consumer).items() if name.startswith("CLOSE_")}
    expected = {"CLOSE_UNAUTHENTICATED", "CLOSE_NOT_FOUND", "CLOSE_TOO_SLOW", "CLOSE_INTERNAL_ERROR"}
    assert set(codes) >= expected
    assert all(code == 1000 or 3000 <= code <= 4999 for code in codes.values()), codes
