"""The web answers the next request after the database closed the connections its pool holds
(a PostgreSQL restart, a failover, a proxy's idle timeout): no 500s until someone restarts it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection

from runs.runner import connections

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def terminate_the_pooled_connections() -> int:
    """End the backends of every connection idle in this process's pool, as a restart would."""
    pool = connection.pool
    taken = [pool.getconn() for _ in range(pool.get_stats()["pool_available"])]
    try:
        with psycopg.connect(**connections.connection_params(), autocommit=True) as admin:
            ended = "SELECT count(pg_terminate_backend(pid)) FROM unnest(%s::int[]) AS pid"
            pids = [conn.info.backend_pid for conn in taken]
            row = admin.execute(ended, [pids]).fetchone()
        # pg_terminate_backend only signals. A backend's socket closes as its process exits
        # (the server runs on this machine, as in CI): wait for that, as after a restart.
        deadline = time.monotonic() + 15
        while any(Path(f"/proc/{pid}").exists() for pid in pids):
            assert time.monotonic() < deadline, "the backends did not exit"
            time.sleep(0.01)
    finally:
        for conn in taken:
            pool.putconn(conn)
    assert row is not None
    return row[0]


def test_a_request_after_the_database_closed_the_pooled_connections_is_served(api: Any, project: Any) -> None:
    assert api.get("/api/projects").status_code == 200
    connection.close()  # the test's own connection goes back to the pool with the rest
    assert terminate_the_pooled_connections() >= 1

    response = api.get("/api/projects")

    assert response.status_code == 200
    assert [item["id"] for item in response.json()] == [project.id]


def test_a_pooled_connection_the_server_closed_is_never_handed_out(db: None) -> None:
    connection.close()
    pool = connection.pool
    assert terminate_the_pooled_connections() >= 1

    conn = pool.getconn()
    try:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        pool.putconn(conn)


def test_a_restart_that_closed_a_full_pool_costs_the_next_request_nothing(api: Any, project: Any) -> None:
    # Eight requests at once leave eight connections in the pool; psycopg_pool alone retried
    # each dead one after a growing pause and gave up (503) with five or more.
    barrier = threading.Barrier(8)

    def request() -> None:
        try:
            barrier.wait(30)
            connection.ensure_connection()
            barrier.wait(30)  # all eight held at once
        finally:
            connection.close()

    threads = [threading.Thread(target=request) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    connection.close()
    assert terminate_the_pooled_connections() >= 8

    response = api.get("/api/projects")

    assert response.status_code == 200
    assert [item["id"] for item in response.json()] == [project.id]
