"""HTTP under ASGI: Django's middleware and our synchronous views, one thread hop a request."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import AsyncToSync
from asgiref.testing import ApplicationCommunicator
from django.core.handlers.asgi import ASGIHandler

from hermesweb.handlers import OneHopASGIHandler

pytestmark = pytest.mark.django_db(transaction=True)


async def get(app: Any, path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1")],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 80),
    }
    communicator = ApplicationCommunicator(app, scope)
    await communicator.send_input({"type": "http.request", "body": b""})
    start = await communicator.receive_output(10)
    body = await communicator.receive_output(10)
    await communicator.wait(10)
    return start, body


def loop_returns(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Each time code in the request's thread went back to the event loop (async_to_sync)."""
    returns: list[Any] = []
    real = AsyncToSync.__call__

    def spy(self: AsyncToSync, *args: Any, **kwargs: Any) -> Any:
        returns.append(self.awaitable)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(AsyncToSync, "__call__", spy)
    return returns


def test_the_asgi_app_serves_http_with_the_one_hop_handler() -> None:
    from hermesweb.asgi import django_asgi_app

    assert isinstance(django_asgi_app, OneHopASGIHandler)


def test_middleware_and_view_run_in_the_thread_without_going_back_to_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    returns = loop_returns(monkeypatch)
    start, body = asyncio.run(get(OneHopASGIHandler(), "/login/"))
    assert start["status"] == 200
    headers = {name.lower(): value for name, value in start["headers"]}
    assert headers[b"x-frame-options"] == b"DENY"  # the middleware ran
    assert b"csrfmiddlewaretoken" in body["body"]  # and the view, with CSRF's token
    assert headers[b"set-cookie"].startswith(b"csrftoken=")
    assert returns == []


def test_djangos_own_handler_goes_back_to_the_loop_inside_a_request(monkeypatch: pytest.MonkeyPatch) -> None:
    # What the handler saves: the stock chain returns to the loop between middleware and view.
    returns = loop_returns(monkeypatch)
    start, _ = asyncio.run(get(ASGIHandler(), "/login/"))
    assert start["status"] == 200
    assert returns
