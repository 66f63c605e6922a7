"""The journal's rows as SQL: statements named for this database, rows inserted and built.

Design note: docs/journal.md ("Writing"). Shared by the append and read sides.
"""

from __future__ import annotations

import calendar
import json
from collections.abc import Mapping
from datetime import datetime
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
        **{
            name: quote(name)
            for name in ("id", "session_id", "status", "last_seq", "seq", "envelope_json", *_COLUMNS)
        },
    )


# Rows per INSERT statement on SQLite: 7 parameters a row stays far below its variable limit.
ROWS_PER_INSERT = 500
_COLUMNS = ("run_id", "seq", "type", "created_at", "terminal", "payload")


def insert(
    rows: list[tuple[int, int, str, bool, Any]], now: Any, sessions: Mapping[int, int]
) -> list[JournalEvent]:
    """Insert (run id, seq, type, terminal, payload) rows; returns them as saved models.

    `sessions` maps each run to its session: on SQLite each row's envelope text is stored
    with it (`envelope_json`), spelled as readers spell it (`envelope_texts`).

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
    texts: list[str | None] = [None] * len(rows)
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
            texts = _stored_envelopes(rows, payloads, epoch_of_stored_text(created_at), sessions)
            for start in range(0, len(rows), ROWS_PER_INSERT):
                chunk = range(start, min(start + ROWS_PER_INSERT, len(rows)))
                params: list[Any] = []
                for i in chunk:
                    run_id, seq, type_, terminal, _ = rows[i]
                    params += (run_id, seq, type_, created_at, terminal, payloads[i], texts[i])
                sql = sql_for(
                    "INSERT INTO {event} "
                    "({run_id}, {seq}, {type}, {created_at}, {terminal}, {payload}, {envelope_json}) "
                )
                sql += "VALUES " + ", ".join(["(%s, %s, %s, %s, %s, %s, %s)"] * len(chunk))
                if returning:
                    # Mapped by (run, seq): SQLite does not promise RETURNING in VALUES order.
                    cursor.execute(sql + sql_for(" RETURNING {id}, {run_id}, {seq}"), params)
                    ids.update(((run_id, seq), pk) for pk, run_id, seq in cursor.fetchall())
                else:
                    cursor.execute(sql, params)
    alias = connection.alias
    return [
        saved_event(alias, ids.get((run_id, seq)), run_id, seq, type_, now, terminal, payload, text)
        for (run_id, seq, type_, terminal, payload), text in zip(rows, texts, strict=True)
    ]


# On SQLite a row keeps its envelope's text only while its payload is at most this long: building
# the rest of an envelope costs a replay about a microsecond a row, which matters beside a short
# payload and not beside a long one, while the copy doubles the long one on disk.
STORED_ENVELOPE_MAX_PAYLOAD = 2048


def _stored_envelopes(
    rows: list[tuple[int, int, str, bool, Any]], payloads: list[str], epoch: str, sessions: Mapping[int, int]
) -> list[str | None]:
    """Each row's envelope text to keep, in order (None: readers spell it); one run's rows together."""
    by_run: dict[int, list[int]] = {}
    for i, row in enumerate(rows):
        if len(payloads[i]) <= STORED_ENVELOPE_MAX_PAYLOAD:
            by_run.setdefault(row[0], []).append(i)
    texts: list[str | None] = [None] * len(rows)
    for run_id, places in by_run.items():
        fetched = [(rows[i][1], rows[i][2], epoch, rows[i][3], payloads[i]) for i in places]
        for i, (_, _, text) in zip(places, envelope_texts(run_id, sessions[run_id], fetched), strict=True):
            texts[i] = text
    return texts


def envelope_texts(
    run_id: int, session_id: int, fetched: list[tuple[int, str, str, Any, str]]
) -> list[tuple[int, bool, str]]:
    """(seq, terminal, envelope text) of one run's (seq, type, epoch text, terminal, payload text) rows.

    The one spelling of an envelope in Python, for rows written (SQLite stores it) and read
    (PostgreSQL). One loop over the page with every per-run and per-type part made once: this
    is the per-event cost of a replay. Each text parses to exactly `JournalEvent.envelope()`.
    """
    head, ids = envelope_parts(run_id, session_id)
    types: dict[str, str] = {}
    spelled: list[tuple[int, bool, str]] = []
    for seq, type_, created_at, terminal, payload in fetched:
        type_json = types.get(type_) or types.setdefault(type_, orjson.dumps(type_).decode())
        final = bool(terminal)
        spelled.append(
            (
                seq,
                final,
                f'{head}{seq}","seq":{seq}{ids}{type_json},"created_at":{created_at},'
                f'"terminal":{"true" if final else "false"},"payload":{payload}}}',
            )
        )
    return spelled


def envelope_parts(run_id: int, session_id: int) -> tuple[str, str]:
    """A run's two parts of each envelope's text: what comes before the seq, and what comes
    between the seq and the type (SQLite's reads splice the same two)."""
    return f'{{"event_id":"{run_id}:', f',"run_id":{run_id},"session_id":{session_id},"type":'


def epoch_of_stored_text(stored: str) -> str:
    """SQLite's stored "YYYY-MM-DD HH:MM:SS[.ffffff]" (naive UTC) as a JSON number: its epoch.

    The exact decimal of the stored microseconds, so a JSON parser reads the same double as
    `created_at.timestamp()` (both roundings are correct ones).
    """
    return _whole_seconds(stored[:19]) + (stored[19:26] or ".0")


@lru_cache(maxsize=4096)
def _whole_seconds(stored: str) -> str:
    return str(calendar.timegm(datetime.fromisoformat(stored).timetuple()))


def saved_event(
    alias: str,
    pk: int | None,
    run_id: int,
    seq: int,
    type_: str,
    created_at: Any,
    terminal: bool,
    payload: Any,
    envelope_json: str | None = None,
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
        envelope_json=envelope_json,
    )
    return event


def dump_json(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        # What JSONField did (json.dumps) for what orjson refuses, e.g. integers beyond 64 bits.
        return json.dumps(value)
