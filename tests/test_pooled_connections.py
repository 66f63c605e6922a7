"""Threads keep a usable SQLite connection between calls: the loop's pool threads
(runs.live.reads.pooled), and the request threads (tests/test_http_handler.py).

A socket's catch-up reads a page per call: on SQLite, reopening the connection for each (pragmas,
the schema, a cold page cache) cost ~3 ms of a ~13 ms page. SQLite's connections are kept
(settings, CONN_MAX_AGE None) when Django closes old connections; PostgreSQL's still go back to
their pool after every call, and a connection left outside autocommit is never kept.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import close_old_connections, connection

from runs.live.reads import pooled
from runs.models import Run

# Each thread has its own connection, outside the test's transaction.
pytestmark = pytest.mark.django_db(transaction=True)


def in_a_thread[T](fn: Callable[[], T]) -> T:
    result: list[T] = []
    thread = threading.Thread(target=lambda: result.append(fn()))
    thread.start()
    thread.join()
    return result[0]


def connection_after_a_read() -> Any:
    Run.objects.filter(pk=0).exists()
    return connection.connection


def connection_before_and_after_a_read() -> tuple[Any, Any]:
    before = connection.connection
    return before, connection_after_a_read()


def test_pooled_calls_on_one_thread_share_its_sqlite_connection_and_release_others() -> None:
    async def two_calls() -> list[tuple[Any, Any]]:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))
        read = pooled(connection_before_and_after_a_read)
        return [await read(), await read()]

    (_, first), (found, _) = asyncio.run(two_calls())

    if connection.vendor == "sqlite":
        assert found is first
    else:
        assert found is None  # back to PostgreSQL's pool after each call


def test_closing_old_connections_keeps_a_usable_sqlite_connection_and_closes_others() -> None:
    def kept() -> bool:
        raw = connection_after_a_read()
        close_old_connections()
        still = connection.connection is raw
        connection.close()
        return still

    assert in_a_thread(kept) is (connection.vendor == "sqlite")


def test_closing_old_connections_closes_one_left_outside_autocommit() -> None:
    def closed() -> bool:
        connection_after_a_read()
        connection.set_autocommit(False)
        close_old_connections()
        return connection.connection is None

    assert in_a_thread(closed)
