"""The session socket admits only a signed-in user who can see the session, from our own origin."""

from __future__ import annotations

from typing import Any

import pytest
from websockets.exceptions import InvalidStatus

from tests import factories
from tests.support.live import LiveStack, layer, live, session_cookie  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def stack(live: LiveStack) -> LiveStack:
    live.start_daphne(HERMESWEB_LIVE_HEARTBEAT_SECONDS="0.3")
    return live


def test_it_closes_an_anonymous_socket_with_4401(stack: LiveStack) -> None:
    session = factories.SessionFactory()
    socket = stack.socket(session.pk, cookie=None)
    assert socket.close_code() == 4401


def test_it_closes_with_4404_for_someone_elses_session(stack: LiveStack) -> None:
    session = factories.SessionFactory()
    mallory = factories.UserFactory(username="mallory")
    socket = stack.socket(session.pk, session_cookie(mallory))
    assert socket.close_code() == 4404


def test_it_closes_with_4404_for_a_missing_session(stack: LiveStack) -> None:
    user = factories.UserFactory()
    socket = stack.socket(987654, session_cookie(user))
    assert socket.close_code() == 4404


def test_staff_may_not_watch_anyone_elses_session(stack: LiveStack) -> None:
    session = factories.SessionFactory()
    root = factories.UserFactory(username="root", is_staff=True)
    socket = stack.socket(session.pk, session_cookie(root))
    assert socket.close_code() == 4404


@pytest.mark.parametrize("origin", ["http://evil.example", "http://127.0.0.1.evil.example", None])
def test_it_refuses_a_cross_origin_handshake(stack: LiveStack, origin: str | None) -> None:
    session = factories.SessionFactory()
    with pytest.raises(InvalidStatus) as refused:
        stack.socket(session.pk, session_cookie(session.project.owner), origin=origin)
    assert refused.value.response.status_code == 403


def test_it_answers_ping_and_sends_cursorless_heartbeats(stack: LiveStack) -> None:
    session = factories.SessionFactory()
    socket = stack.socket(session.pk, session_cookie(session.project.owner))
    socket.send(type="ping")
    assert socket.until(lambda f: f["type"] == "pong")
    heartbeat = socket.until(lambda f: f["type"] == "heartbeat", timeout=10)[-1]
    assert heartbeat == {"type": "heartbeat"}


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"type": "dance"}', "unknown message type"),
        ('{"type": "subscribe", "after": [1]}', "'after' must be an object"),
        ('{"type": "subscribe", "after": {"x": 1}}', "not a positive integer"),
        ('{"type": "subscribe", "after": {"1": -1}}', "integer seq"),
        ('{"type": "subscribe", "after": {"1": "3"}}', "integer seq"),
        ('{"type": "subscribe", "after": {"1": true}}', "integer seq"),
    ],
)
def test_a_malformed_message_gets_bad_request_and_the_socket_stays_open(
    stack: LiveStack, raw: str, why: str
) -> None:
    session = factories.SessionFactory()
    socket = stack.socket(session.pk, session_cookie(session.project.owner))
    socket.ws.send(raw)
    error = socket.until(lambda f: f["type"] == "error")[-1]
    assert error["code"] == "bad_request"
    assert why in error["message"]
    socket.send(type="ping")
    assert socket.until(lambda f: f["type"] == "pong")


def test_a_binary_frame_gets_bad_request(stack: LiveStack) -> None:
    session: Any = factories.SessionFactory()
    socket = stack.socket(session.pk, session_cookie(session.project.owner))
    socket.ws.send(b'{"type": "ping"}')
    assert socket.until(lambda f: f["type"] == "error")[-1]["code"] == "bad_request"
    socket.subscribe()
    assert socket.session()["session_id"] == session.pk


def test_a_socket_reads_its_session_once_and_its_sends_pass_straight_through() -> None:
    # Channels' SessionMiddleware checks the session on every frame a socket sends, to save
    # it; a socket never changes it, and that check was ~15% of fanning out a frame.
    from asgiref.sync import async_to_sync
    from channels.sessions import SessionMiddleware

    from hermesweb.asgi import application
    from hermesweb.auth import SocketSessionMiddleware

    user = factories.UserFactory()
    seen: dict[str, Any] = {}

    async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.update(user=scope["user"], send=send)

    async def send(message: dict[str, Any]) -> None:
        return None

    middleware = SocketSessionMiddleware(inner)
    cookies = {"sessionid": session_cookie(user)}
    async_to_sync(middleware)({"type": "websocket", "cookies": cookies}, None, send)
    assert seen["send"] is send and seen["user"] == user
    async_to_sync(middleware)({"type": "websocket", "cookies": {"sessionid": "stale"}}, None, send)
    assert not seen["user"].is_authenticated

    stack, layers = application.application_mapping["websocket"], []
    while stack is not None:
        layers.append(type(stack))
        stack = getattr(stack, "inner", None) or getattr(stack, "application", None)
    assert SocketSessionMiddleware in layers and SessionMiddleware not in layers


@pytest.mark.parametrize(
    "change",
    ["nothing", "signed_out", "expired", "password_changed", "deactivated"],
)
def test_a_sockets_sign_in_is_checked_again_as_djangos_get_user_would(change: str) -> None:
    # socket_user_now checks the sign-in in SQL (the default engine and backend: StillSignedIn)
    # and must agree with Django's get_user, which it otherwise calls.
    from datetime import timedelta
    from types import SimpleNamespace

    from django.contrib.auth import get_user
    from django.contrib.sessions.backends.db import SessionStore
    from django.contrib.sessions.models import Session as DjangoSession
    from django.utils import timezone

    from hermesweb.auth import socket_sign_in, socket_user_now

    user = factories.UserFactory()
    key = session_cookie(user)
    scope = {"user": user, "session": SessionStore(key)}
    assert scope["session"].keys()  # read as the socket connects (SocketSessionMiddleware)
    if change == "signed_out":
        DjangoSession.objects.filter(session_key=key).delete()
    elif change == "expired":
        past = timezone.now() - timedelta(seconds=1)
        DjangoSession.objects.filter(session_key=key).update(expire_date=past)
    elif change == "password_changed":
        elsewhere = type(user).objects.get(pk=user.pk)  # the socket's user object stays as it was
        elsewhere.set_password("changed elsewhere")
        elsewhere.save()
    elif change == "deactivated":
        type(user).objects.filter(pk=user.pk).update(is_active=False)

    # The production settings (the login throttle listed before the model backend) take SQL.
    assert socket_sign_in(scope) is not None
    fast = socket_user_now(scope)
    asked = get_user(SimpleNamespace(session=SessionStore(key)))
    generic = asked if asked.is_authenticated else None

    assert (fast is None) == (generic is None) == (change != "nothing")
    if fast is not None:
        assert fast.pk == generic.pk == user.pk
