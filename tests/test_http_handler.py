"""HTTP under ASGI: Django's middleware and our synchronous views, one thread hop a request, on
threads kept between requests."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from asgiref.sync import AsyncToSync
from asgiref.testing import ApplicationCommunicator
from django.core.handlers.asgi import ASGIHandler
from django.db import connection
from django.http import HttpResponse

from hermesweb.handlers import OneHopASGIHandler, RequestThreads

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


def test_a_large_body_goes_to_the_server_as_one_message(monkeypatch: pytest.MonkeyPatch) -> None:
    # An events page is about 1 MB: Django's 64 KiB messages each crossed channels and Twisted.
    page = b"[" + b",".join(b'{"seq":%d}' % seq for seq in range(40_000)) + b"]"
    assert len(page) > 5 * 2**16
    monkeypatch.setattr(OneHopASGIHandler, "get_response", lambda self, request: HttpResponse(page))
    start, body = asyncio.run(get(OneHopASGIHandler(), "/login/"))
    assert start["status"] == 200
    assert body == {"type": "http.response.body", "body": page, "more_body": False}


def served_by(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, Any]]:
    """(thread, the thread's database connection) of each request's middleware and view."""
    seen: list[tuple[int, Any]] = []
    real = OneHopASGIHandler.get_response

    def spy(self: OneHopASGIHandler, request: Any) -> Any:
        response = real(self, request)
        connection.ensure_connection()  # as any view reading the database would
        seen.append((threading.get_ident(), connection.connection))
        return response

    monkeypatch.setattr(OneHopASGIHandler, "get_response", spy)
    return seen


def test_requests_one_after_another_are_served_by_one_kept_thread_and_its_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = served_by(monkeypatch)
    handler = OneHopASGIHandler()

    async def three() -> None:
        for _ in range(3):
            start, _ = await get(handler, "/login/")
            assert start["status"] == 200
            await settled(handler)

    asyncio.run(three())
    assert len({thread for thread, _ in seen}) == 1
    if connection.vendor == "sqlite":
        # No server to hand it back to: the thread keeps its connection (settings, CONN_MAX_AGE).
        assert len({id(conn) for _, conn in seen}) == 1


async def settled(handler: OneHopASGIHandler) -> None:
    """Until the last request's thread is back among the idle ones."""
    for _ in range(200):
        if handler.threads.idle:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the request's thread never came back")


def test_a_thread_still_running_a_request_is_not_lent_to_the_next() -> None:
    threads = RequestThreads(keep=4)
    release = threading.Event()

    async def scenario() -> None:
        first = threads.borrow()
        running = first.submit(release.wait, 10)  # a view whose client went away, still running
        threads.give_back(first)
        await asyncio.sleep(0.05)
        assert threads.idle == []
        assert threads.borrow() is not first
        release.set()
        await asyncio.wrap_future(running)
        for _ in range(200):
            if threads.idle:
                break
            await asyncio.sleep(0.01)
        assert threads.idle == [first]

    asyncio.run(scenario())


def test_threads_beyond_those_kept_end_after_their_request() -> None:
    threads = RequestThreads(keep=1)

    def ended(executor: ThreadPoolExecutor) -> bool:
        try:
            executor.submit(int).cancel()
        except RuntimeError:  # shut down: it takes no more work
            return True
        return False

    async def scenario() -> list[ThreadPoolExecutor]:
        lent = [threads.borrow(), threads.borrow()]
        for executor in lent:
            threads.give_back(executor)
        for _ in range(200):
            if len(threads.idle) == 1 and any(ended(executor) for executor in lent):
                break
            await asyncio.sleep(0.01)
        return lent

    lent = asyncio.run(scenario())
    assert len(threads.idle) == 1
    (kept,) = threads.idle
    assert not ended(kept)
    assert [ended(executor) for executor in lent if executor is not kept] == [True]
