"""The journal's rows as SQL: statements named for this database, rows inserted and built.

Design note: docs/journal.md ("Writing"). Shared by the append and read sides.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import orjson
from django.db import connection
from django.db.models.base import ModelState

from runs.models import JournalEvent, Run


def sql_for(template: str) -> str:
    """`template` with {run}, {event} and column names quoted for this connection's database."""
    return _format_sql(connection.vendor, template)


@lru_cache(maxsize=64)
def _format_sql(vendor: str, template: str) -> str:
    quote = connection.ops.quote_name
    return template.format(
        run=quote(Run._meta.db_table),
        event=quote(JournalEvent._meta.db_table),
        **{name: quote(name) for name in ("id", "session_id", "status", "last_seq", "seq", *_COLUMNS)},
    )


# Rows per INSERT statement on SQLite: 6 parameters a row stays far below its variable limit.
ROWS_PER_INSERT = 500
_COLUMNS = ("run_id", "seq", "type", "created_at", "terminal", "payload")


def insert(rows: list[tuple[int, int, str, bool, Any]], now: Any) -> list[JournalEvent]:
    """Insert (run id, seq, type, terminal, payload) rows; returns them as saved models.

    bulk_create spent most of an append in per-field ORM preparation and
    JSONField's json.dumps. These rows are uniform, so the statement is fixed and
    values go to the driver as they are: on PostgreSQL as one array per column
    (`unnest`: a short statement whatever the batch size, no per-row literal to
    parse), on SQLite as one multi-row VALUES. Same table, columns and values
    as bulk_create wrote. Rows may belong to several runs (a group commit).
    """
    created_at = connection.ops.adapt_datetimefield_value(now)
    payloads = [dump_json(row[4]) for row in rows]
    ids: dict[tuple[int, int], int] = {}
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                sql_for(
                    "INSERT INTO {event} ({run_id}, {seq}, {type}, {created_at}, {terminal}, {payload}) "
                    "SELECT u.run_id, u.seq, u.type, %s, u.terminal, u.payload::jsonb "
                    "FROM unnest(%s::bigint[], %s::integer[], %s::text[], %s::boolean[], %s::text[]) "
                    "AS u(run_id, seq, type, terminal, payload) RETURNING {id}, {run_id}, {seq}"
                ),
                [created_at, *([r[i] for r in rows] for i in range(4)), payloads],
            )
            ids.update(((run_id, seq), pk) for pk, run_id, seq in cursor.fetchall())
        else:
            returning = connection.features.can_return_rows_from_bulk_insert
            for start in range(0, len(rows), ROWS_PER_INSERT):
                chunk = range(start, min(start + ROWS_PER_INSERT, len(rows)))
                params: list[Any] = []
                for i in chunk:
                    run_id, seq, type_, terminal, _ = rows[i]
                    params += (run_id, seq, type_, created_at, terminal, payloads[i])
                sql = sql_for(
                    "INSERT INTO {event} ({run_id}, {seq}, {type}, {created_at}, {terminal}, {payload}) "
                )
                sql += "VALUES " + ", ".join(["(%s, %s, %s, %s, %s, %s)"] * len(chunk))
                if returning:
                    # Mapped by (run, seq): SQLite does not promise RETURNING in VALUES order.
                    cursor.execute(sql + sql_for(" RETURNING {id}, {run_id}, {seq}"), params)
                    ids.update(((run_id, seq), pk) for pk, run_id, seq in cursor.fetchall())
                else:
                    cursor.execute(sql, params)
    alias = connection.alias
    return [
        saved_event(alias, ids.get((run_id, seq)), run_id, seq, type_, now, terminal, payload)
        for run_id, seq, type_, terminal, payload in rows
    ]


def saved_event(
    alias: str,
    pk: int | None,
    run_id: int,
    seq: int,
    type_: str,
    created_at: Any,
    terminal: bool,
    payload: Any,
) -> JournalEvent:
    """A JournalEvent as loaded from the database, built the way unpickling builds one.

    Model.__init__ (field iteration, pre_init/post_init signals) cost more than reading
    the row; these rows have no deferred or related fields to set up.
    """
    event = JournalEvent.__new__(JournalEvent)
    state = ModelState()
    state.adding = False
    state.db = alias
    event.__dict__.update(
        _state=state,
        id=pk,
        run_id=run_id,
        seq=seq,
        type=type_,
        created_at=created_at,
        terminal=terminal,
        payload=payload,
    )
    return event


def dump_json(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        # What JSONField did (json.dumps) for what orjson refuses, e.g. integers beyond 64 bits.
        return json.dumps(value)
