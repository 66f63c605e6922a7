"""PostgreSQL lock waits, seen from the test's own connection (deadlock tests)."""

from __future__ import annotations

from django.db import connection


def another_backend_waits_on_a_lock() -> bool:
    """Whether some other connection to the test database is waiting on a lock now."""
    with connection.cursor() as cursor:
        # Inside a transaction pg_stat_activity is read once and cached: read it afresh.
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0] > 0
