"""The fault proxy's outage is a clean cut: once `down()` returns, nothing a client sent before
it can still change the database. The outage tests measure "nothing reached the database
meanwhile" from that moment, so a statement still running on the server when the proxy closed
its connection must have ended (here: committed) before `down()` returns."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from django.db import connection

from runs.runner import connections
from tests.support.pgproxy import UNENCRYPTED, PgProxy
from tests.support.procs import wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TABLE = "test_pgproxy_outage_probe"
LOCK = 740_251  # an advisory lock the statement waits on, held by the test


@pytest.fixture
def probe() -> Any:
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {TABLE} (x int)")
    yield
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE {TABLE}")


def rows() -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {TABLE}")
        return cursor.fetchone()[0]


def waiting_on_the_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
            [f"%pg_advisory_xact_lock({LOCK})%"],
        )
        return cursor.fetchone()[0] > 0


def test_a_statement_running_when_the_proxy_goes_down_has_ended_when_down_returns(
    pg_proxy: PgProxy, probe: None
) -> None:
    direct = connections.connection_params()
    through_the_proxy = {**direct, "host": "127.0.0.1", "port": pg_proxy.port, **UNENCRYPTED}
    client = psycopg.connect(**through_the_proxy, autocommit=True)
    with psycopg.connect(**direct, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", [LOCK])
        cut: list[Exception] = []

        def send() -> None:
            try:  # one simple query: one transaction, committed once the lock is free
                client.execute(f"SELECT pg_advisory_xact_lock({LOCK}); INSERT INTO {TABLE} VALUES (1)")
            except psycopg.OperationalError as error:
                cut.append(error)

        sender = threading.Thread(target=send)
        sender.start()
        wait_for(waiting_on_the_lock, 10, what="the statement to wait on the lock")

        going_down = threading.Thread(target=pg_proxy.down)
        going_down.start()
        wait_for(lambda: cut, 10, what="the client to see its connection closed")
        assert going_down.is_alive()  # the statement still runs on the server: not down yet
        holder.execute("SELECT pg_advisory_unlock(%s)", [LOCK])
    going_down.join(30)

    assert not going_down.is_alive()
    assert rows() == 1  # it committed after its connection was closed, and before down() returned
    client.close()
    pg_proxy.up()
