"""The session socket opens only from the workbench's own origin: scheme, host and port.

Channels' AllowedHostsOriginValidator compared host names only, so a page served on
`http://localhost:3000` could open the socket of the workbench on `:8000` with the user's
cookie and submit prompts; `*` in the allowed hosts turned the check off altogether.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from websockets.exceptions import InvalidStatus

from hermesweb.origins import SameOriginValidator
from tests import factories
from tests.support.live import LiveStack, layer, live, session_cookie  # noqa: F401

REPO = Path(__file__).resolve().parent.parent


async def _accept(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await receive()
    await send({"type": "websocket.accept"})
    await receive()


def handshake(host: str | None, *origins: str, scheme: str = "ws") -> bool:
    """Whether the validator lets a handshake with these Host and Origin headers through."""
    headers = [(b"origin", o.encode()) for o in origins]
    if host is not None:
        headers.append((b"host", host.encode()))

    async def attempt() -> bool:
        communicator = WebsocketCommunicator(SameOriginValidator(_accept), "/ws/sessions/1/", headers)
        communicator.scope["scheme"] = scheme
        connected, _ = await communicator.connect(timeout=5)
        await communicator.disconnect()
        return bool(connected)

    return asyncio.run(attempt())


# ---------------------------------------------------------------- the check itself


def test_a_page_on_another_port_of_the_same_host_cannot_open_the_socket() -> None:
    assert not handshake("localhost:8000", "http://localhost:3000")


def test_a_page_of_the_workbench_itself_opens_the_socket() -> None:
    assert handshake("localhost:8000", "http://localhost:8000")
    assert handshake("127.0.0.1", "http://127.0.0.1:80")  # the default port, written or not
    assert handshake("[::1]:8000", "http://[::1]:8000")


@pytest.mark.parametrize(
    "origin",
    [
        "https://localhost:8000",  # another scheme
        "http://localhost.evil.example:8000",
        "http://evil.example",
        "null",
        "http://localhost:8000/path",
        "http://user@localhost:8000",
        "localhost:8000",
    ],
)
def test_any_other_origin_is_refused(origin: str) -> None:
    assert not handshake("localhost:8000", origin)


def test_a_handshake_without_exactly_one_origin_is_refused() -> None:
    assert not handshake("localhost:8000")
    assert not handshake("localhost:8000", "http://localhost:8000", "http://localhost:8000")


def test_a_host_that_is_not_allowed_is_not_our_origin_even_when_origin_matches_it() -> None:
    # DNS rebinding: a page on evil.example resolved to 127.0.0.1 sends Host and Origin alike.
    assert not handshake("evil.example:8000", "http://evil.example:8000")


def test_a_configured_origin_may_open_the_socket(settings: Any) -> None:
    settings.HERMESWEB_ALLOWED_ORIGINS = ["http://localhost:3000", "https://work.example"]

    assert handshake("localhost:8000", "http://localhost:3000")
    assert handshake("localhost:8000", "https://work.example:443")
    assert not handshake("localhost:8000", "http://work.example")


def test_behind_tls_the_own_origin_is_https(settings: Any) -> None:
    settings.HERMESWEB_HTTPS = True
    settings.ALLOWED_HOSTS = ["work.example"]

    assert handshake("work.example", "https://work.example")
    assert not handshake("work.example", "http://work.example")


def test_a_secure_socket_scope_makes_the_own_origin_https() -> None:
    assert handshake("localhost:8443", "https://localhost:8443", scheme="wss")
    assert not handshake("localhost:8443", "http://localhost:8443", scheme="wss")


# ---------------------------------------------------------------- the real server


@pytest.fixture
def stack(live: LiveStack) -> LiveStack:
    live.start_daphne(HERMESWEB_ALLOWED_ORIGINS="http://localhost:3000")
    return live


@pytest.mark.embedded
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("layer", ["embedded"], indirect=True)
def test_the_workbench_refuses_another_port_and_admits_its_own_origin(stack: LiveStack) -> None:
    session = factories.SessionFactory()
    cookie = session_cookie(session.project.owner)

    for origin in (f"http://127.0.0.1:{stack.port + 1}", f"https://127.0.0.1:{stack.port}"):
        with pytest.raises(InvalidStatus) as refused:
            stack.socket(session.pk, cookie, origin=origin)
        assert refused.value.response.status_code == 403

    own = stack.socket(session.pk, cookie)
    own.subscribe()
    assert own.session()["session_id"] == session.pk
    configured = stack.socket(session.pk, cookie, origin="http://localhost:3000")
    configured.subscribe()
    assert configured.session()["session_id"] == session.pk


# ---------------------------------------------------------------- settings


def load_settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("HERMESWEB_", "DATABASE_URL", "REDIS_URL"))
    }
    base.pop("DEBUG", None)
    base.pop("SECRET_KEY", None)
    show = "from django.conf import settings as s; print(s.ALLOWED_HOSTS, s.HERMESWEB_ALLOWED_ORIGINS)"
    env = {**base, "DJANGO_SETTINGS_MODULE": "hermesweb.settings", "HERMESWEB_DATA_DIR": str(tmp_path), **env}
    return subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {show}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("variable", ["HERMESWEB_ALLOWED_HOSTS", "HERMESWEB_ALLOWED_ORIGINS"])
def test_a_wildcard_is_refused_unless_debug_is_on(tmp_path: Path, variable: str) -> None:
    refused = load_settings(tmp_path, **{variable: "*"})
    assert refused.returncode != 0
    last_line = refused.stderr.strip().splitlines()[-1]
    assert last_line.startswith("django.core.exceptions.ImproperlyConfigured")
    assert variable in last_line

    assert load_settings(tmp_path, **{variable: "*"}, DEBUG="1").returncode == 0


def test_configured_origins_keep_their_scheme_and_port(tmp_path: Path) -> None:
    result = load_settings(
        tmp_path,
        HERMESWEB_ALLOWED_ORIGINS="https://work.example:8443, http://[::1]:3000",
        HERMESWEB_ALLOWED_HOSTS="work.example,[::1]",
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "['work.example', '[::1]'] ['https://work.example:8443', 'http://[::1]:3000']"
    )


@pytest.mark.parametrize("origin", ["work.example", "https://work.example/app", "ftp://work.example"])
def test_a_configured_origin_that_is_not_an_origin_stops_the_settings(tmp_path: Path, origin: str) -> None:
    result = load_settings(tmp_path, HERMESWEB_ALLOWED_ORIGINS=origin)

    assert result.returncode != 0
    assert "HERMESWEB_ALLOWED_ORIGINS" in result.stderr.strip().splitlines()[-1]
