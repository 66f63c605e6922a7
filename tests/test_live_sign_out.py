"""A socket is closed with 4401 within seconds of its sign-in ending (issue 22, item 5).

Logout closes the sockets of that Django session; a password change or a deactivation closes
all of the user's. The fast path is the user's doorbell (hermesweb.auth's signals →
`notify.user_group`): the daphne here re-checks only every 10 minutes, so a close in time is
the doorbell's. The safety net (the periodic batched re-check) is tested on its own, with a
change no signal sees.
"""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from tests import factories
from tests.support.live import LiveSocket, LiveStack, layer, live, session_cookie  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

CSRF = "a" * 32  # any 32-character secret: Django compares the cookie with the header


def start(live: LiveStack, check_seconds: str) -> LiveStack:
    live.start_daphne(HERMESWEB_LIVE_SIGNIN_CHECK_SECONDS=check_seconds)
    return live


def following(stack: LiveStack, session_id: int, cookie: str) -> LiveSocket:
    socket = stack.socket(session_id, cookie)
    socket.subscribe()
    socket.session()
    return socket


def still_open(socket: LiveSocket) -> None:
    socket.send(type="ping")
    assert socket.until(lambda f: f["type"] == "pong", timeout=30)


def closed_within(socket: LiveSocket) -> float:
    began = time.monotonic()
    assert socket.close_code(timeout=30) == 4401
    return time.monotonic() - began


def log_out(stack: LiveStack, cookie: str) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{stack.port}/logout/",
        data=b"",
        method="POST",
        headers={"Cookie": f"sessionid={cookie}; csrftoken={CSRF}", "X-CSRFToken": CSRF},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=30) as response:
        assert response.status in (200, 302), response.status


def test_logout_in_one_tab_closes_that_sessions_sockets_only(live: LiveStack) -> None:
    stack = start(live, "600")
    session = factories.SessionFactory()
    owner = session.project.owner
    tab, other_browser = session_cookie(owner), session_cookie(owner)
    first, second = following(stack, session.pk, tab), following(stack, session.pk, tab)
    elsewhere = following(stack, session.pk, other_browser)
    log_out(stack, tab)  # through daphne, as the browser's sign-out form does
    took = [closed_within(first), closed_within(second)]
    still_open(elsewhere)  # the same user signed in on another browser
    print(f"FIGURE sign_out ({stack.layer}): logout closed both tabs' sockets in {took} s")


@pytest.mark.parametrize("change", ["password", "deactivation"])
def test_a_password_change_or_deactivation_closes_all_the_users_sockets(
    live: LiveStack, change: str, settings: Any
) -> None:
    # Embedded, the test process's save cannot ring daphne's in-memory layer: the re-check does.
    stack = start(live, "600" if live.layer == "redis" else "1")
    session = factories.SessionFactory()
    owner = session.project.owner
    bystander_session = factories.SessionFactory()
    sockets = [following(stack, session.pk, session_cookie(owner)) for _ in range(2)]
    bystander = following(stack, bystander_session.pk, session_cookie(bystander_session.project.owner))
    user = get_user_model().objects.get(pk=owner.pk)
    if change == "password":
        user.set_password("a new one, chosen elsewhere")
    else:
        user.is_active = False
    user.save()
    took = [closed_within(socket) for socket in sockets]
    still_open(bystander)
    print(f"FIGURE sign_out ({stack.layer}, {change}): all the user's sockets closed in {took} s")


def test_the_periodic_recheck_closes_what_no_signal_saw(live: LiveStack) -> None:
    stack = start(live, "1")
    session = factories.SessionFactory()
    owner = session.project.owner
    socket = following(stack, session.pk, session_cookie(owner))
    bystander_session = factories.SessionFactory()
    bystander = following(stack, bystander_session.pk, session_cookie(bystander_session.project.owner))
    get_user_model().objects.filter(pk=owner.pk).update(is_active=False)  # no signal
    closed_within(socket)
    still_open(bystander)
