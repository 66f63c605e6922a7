"""Whether the PostgreSQL server has closed a connection, read without a round trip.

Design note: docs/runner.md ("Losing the database"). A PostgreSQL restart, a failover or a
proxy's idle timeout closes every connection a process holds; the server says so on the
socket (a terminated backend's error, then the end of the stream), and libpq can read that
without blocking. The runner checks its long-lived connections so before each unit of work
(runs/runner/connections.py); the web's pool checks each connection so before handing it out
(settings: `OPTIONS["pool"]["check"]`), where a dead one meant one failed request for
every connection the pool held.

No Django import: settings load this module.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.pq import ConnStatus


def server_closed(conn: Any) -> bool:
    """Whether the server has closed this idle psycopg connection (sync or async): no round trip."""
    if conn.closed:
        return True
    pgconn = conn.pgconn
    try:
        # Twice: a terminated backend's last message comes before the end of the stream,
        # and one read takes only the message.
        pgconn.consume_input()
        pgconn.consume_input()
    except psycopg.OperationalError:
        return True
    return pgconn.status != ConnStatus.OK


def check_pooled(conn: psycopg.Connection[Any]) -> None:
    """psycopg_pool's `check`: refuse a connection the server closed (the pool opens another).

    One closed connection means a restart closed them all: the pool's own `check()` replaces
    every idle one now, since getconn retries each dead one after a growing pause (1, 2, 4 s…)
    and gave up after its 10 s with five or more dead in the pool.
    """
    if server_closed(conn):
        pool = getattr(conn, "_pool", None)  # psycopg_pool's link to the pool that lent it
        if pool is not None:
            pool.check()
        raise psycopg.OperationalError("the server closed this pooled connection")
