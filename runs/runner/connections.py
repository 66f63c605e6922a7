"""The runner's database connections outlive any request, so they must notice a lost server.

Design note: docs/runner.md ("Losing the database"). Django replaces a broken connection
at the start and end of each request (`close_old_connections`); a runner has no requests:
its threads (asgiref's database thread, the journal writer's) keep one connection each for
as long as the process runs. After a PostgreSQL restart, a failover or a proxy's idle
timeout every one of them stayed broken and the runner had to be restarted by hand.

`revive()` runs at the start of each unit of the runner's database work, in the thread that
does it. It costs no round trip: libpq reads what the server sent while the connection was
idle (a terminated backend's error, the end of the stream) without blocking, and the
connection is replaced only if that shows it closed, or if an earlier statement on it failed
and it no longer answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable
from typing import Any

import psycopg
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

from runs.pgcheck import server_closed

log = logging.getLogger(__name__)

# A pool may hand back another connection the same outage closed; each is seen at once.
ATTEMPTS = 3


def revive() -> None:
    """Replace this thread's database connection if the server has closed it."""
    if connection.in_atomic_block:
        return  # the caller's transaction owns it; its failure is the caller's to handle
    for _ in range(ATTEMPTS):
        if connection.connection is None:
            return  # opened fresh on first use
        if connection.errors_occurred:
            connection.close_if_unusable_or_obsolete()
        elif _server_closed():
            log.warning("the database closed this thread's connection; opening another")
            connection.close()
        else:
            return
        if connection.vendor != "postgresql":
            return
        connection.ensure_connection()


def revived[**P, R](func: Callable[P, R]) -> Callable[P, R]:
    """`func`, after `revive()`: for the entry points of the runner's database work."""

    @functools.wraps(func)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        revive()
        return func(*args, **kwargs)

    return call


class Retrying:
    """Tries of database work through an outage: doubling pauses from 50 ms to 1 s, for
    HERMESWEB_DB_RETRY_SECONDS from the first failure."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._deadline = self._loop.time() + settings.HERMESWEB_DB_RETRY_SECONDS
        self._pause = 0.05

    @property
    def over(self) -> bool:
        return self._loop.time() >= self._deadline

    async def pause(self) -> None:
        await asyncio.sleep(self._pause)
        self._pause = min(self._pause * 2, 1.0)


async def retried[**P, R](func: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """`func` in the database thread, after `revive()`; through a lost connection or an outage
    tried again (`Retrying`). Only for work that may be done twice (an UPDATE to the same
    values): whether a failed try committed is not known.
    """
    retrying: Retrying | None = None
    while True:
        try:
            return await sync_to_async(revived(func))(*args, **kwargs)
        except (OperationalError, InterfaceError):
            retrying = retrying or Retrying()
            if retrying.over:
                raise
            log.warning("%s failed on its connection; trying again", func.__name__, exc_info=True)
        await retrying.pause()


def _server_closed() -> bool:
    return connection.vendor == "postgresql" and server_closed(connection.connection)


def connection_params() -> dict[str, Any]:
    """How a runner's own async connection reaches the database Django uses."""
    params = connection.get_connection_params()
    for sync_only in ("cursor_factory", "context"):
        params.pop(sync_only, None)
    return params


async def connect() -> psycopg.AsyncConnection[Any]:
    """A connection of the runner's own, in its loop (autocommit), to the database Django uses."""
    return await psycopg.AsyncConnection.connect(**connection_params(), autocommit=True)


class LoopConnection:
    """A PostgreSQL connection of the runner's own, in its event loop, in autocommit.

    For the statements on a first token's path (the claim, the journal's group commit):
    through Django's connection each went to a database thread and back, two thread hops.
    Opened at first use, and again when the server has closed it (`server_closed`, no round
    trip); a caller that saw a statement fail on it calls `discard()`.
    """

    def __init__(self) -> None:
        self._conn: psycopg.AsyncConnection[Any] | None = None

    async def get(self) -> psycopg.AsyncConnection[Any]:
        if self._conn is not None and server_closed(self._conn):
            log.warning("the database closed a connection of the runner's loop; opening another")
            await self.discard()
        if self._conn is None:
            self._conn = await connect()
        return self._conn

    async def discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                await conn.close()
