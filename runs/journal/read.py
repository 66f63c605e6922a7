"""Reading a run's journal after a cursor: pages for the API, the socket's catch-up, replays.

Design note: docs/journal.md ("Reading"). A cursor is exclusive (`seq > after_seq`); one the
run never reached is CursorAhead, one inside the compacted range CursorExpired.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

import orjson
from django.conf import settings
from django.db import DataError, connection

from runs.journal.events import CursorAhead, CursorExpired
from runs.journal.rows import envelope_parts, envelope_texts, saved_event, sql_for
from runs.models import JournalEvent, Run


def read_after(run: Run, after_seq: int = 0, limit: int | None = None) -> list[JournalEvent]:
    """Events with seq > after_seq, oldest first; raises CursorAhead/CursorExpired."""
    check_cursor(run, after_seq)
    limit = min(limit or settings.HERMESWEB_EVENTS_PAGE_MAX, settings.HERMESWEB_EVENTS_PAGE_MAX)
    alias = connection.alias
    return [
        saved_event(alias, pk, run.pk, seq, type_, created_at, terminal, payload)
        for pk, seq, type_, created_at, terminal, payload in _read_rows(run, after_seq, limit)
    ]


def _page_bounds(run: Run, after_seq: int, limit: int) -> tuple[str, list[int]]:
    """The WHERE clause of a page, and its parameters.

    Past `compacted_through` a run's seqs have no gaps, so a page is exactly the range
    (after_seq, after_seq + limit]: saying so lets PostgreSQL walk the (run, seq) index
    for those rows instead of trusting a row estimate that a fast-growing run (or one
    bulk-loaded before the next ANALYZE) has outgrown — that plan sorts the whole rest
    of the run for every page. A compacted run's early seqs have gaps: no upper bound there.
    """
    if after_seq >= run.compacted_through:
        return "{run_id} = %s AND {seq} > %s AND {seq} <= %s", [run.pk, after_seq, after_seq + limit]
    return "{run_id} = %s AND {seq} > %s", [run.pk, after_seq]


def _read_rows(run: Run, after_seq: int, limit: int) -> list[tuple[int, int, str, Any, bool, Any]]:
    """(id, seq, type, created_at, terminal, payload) rows, decoded as the model fields would.

    A replay reads thousands of rows a second: the ORM's per-row converters (and
    JSONField's json.loads) cost several times the query itself. Same rows, same values.
    """
    where, params = _page_bounds(run, after_seq, limit)
    sql = sql_for(
        "SELECT {id}, {seq}, {type}, {created_at}, {terminal}, {payload} FROM {event} "
        f"WHERE {where} ORDER BY {{seq}} LIMIT %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, limit])
        rows = cursor.fetchall()
    if not rows:
        return []
    sqlite = connection.vendor == "sqlite"
    out = []
    for pk, seq, type_, created_at, terminal, payload in rows:
        if sqlite:
            # Stored as naive UTC text, as Django's SQLite backend writes and reads it.
            created_at = _parse_sqlite_datetime(created_at)
        if isinstance(payload, (str, bytes)):
            payload = orjson.loads(payload)
        out.append((pk, seq, type_, created_at, bool(terminal), payload))
    return out


@dataclass
class EncodedPage:
    """A page of one run's envelopes, already JSON: (seq, terminal, envelope text) each."""

    rows: list[tuple[int, bool, str]]
    last_seq: int  # the run's, or the page's last if events landed after the run was read
    terminal: bool
    has_more: bool

    def json_array(self) -> str:
        return "[" + ",".join([text for _, _, text in self.rows]) + "]"


def read_encoded(
    run: Run,
    after_seq: int = 0,
    limit: int | None = None,
    upto: int | None = None,
    max_chars: int | None = None,
) -> EncodedPage:
    """read_after, but each envelope comes back as its JSON text, built without decoding the payload.

    `max_chars`: the page also ends once its payloads reach that many characters (with at
    least one event), so that a page of large tool outputs stays small (`_within_chars`).

    Catch-up is the hottest read there is (a reconnecting client may ask for a whole
    run): decoding each payload only to encode it again costs more than the query.
    SQLite has the text stored with the row (or spells it, `_sqlite_envelope`);
    PostgreSQL hands jsonb back as text and the epoch as a double, and `envelope_texts`
    spells it. Each text parses to exactly `JournalEvent.envelope()`.
    """
    check_cursor(run, after_seq)
    limit = min(limit or settings.HERMESWEB_EVENTS_PAGE_MAX, settings.HERMESWEB_EVENTS_PAGE_MAX)
    if upto is not None:
        limit = min(limit, max(upto - after_seq, 1))
    where, params = _page_bounds(run, after_seq, limit)
    bound = [] if max_chars is None else [max_chars]
    if connection.vendor == "sqlite":
        sql = sql_for(
            "SELECT {seq} AS seq, CAST({terminal} AS INTEGER) AS terminal, "
            f"{_sqlite_envelope()} AS envelope{_SIZE if bound else ''} "
            f"FROM {{event}} WHERE {where} ORDER BY {{seq}} LIMIT %s"
        )
        if bound:
            sql = _within_chars(sql, "seq, terminal, envelope")
        with connection.cursor() as cursor:
            cursor.execute(sql, [*envelope_parts(run.pk, run.session_id), *params, limit, *bound])
            rows = [(seq, bool(terminal), text) for seq, terminal, text in cursor.fetchall()]
    else:
        sql = sql_for(
            "SELECT {seq} AS seq, {type} AS type, EXTRACT(EPOCH FROM {created_at})::text AS epoch, "
            f"{{terminal}} AS terminal, {{payload}}::text AS payload "
            f"FROM {{event}} WHERE {where} ORDER BY {{seq}} LIMIT %s"
        )
        if bound:
            # The payload's text, as the page spells it: converting the jsonb once more would cost.
            sql = _within_chars(sql, "seq, type, epoch, terminal, payload", size="length(payload)")
        with connection.cursor() as cursor:
            cursor.execute(sql, [*params, limit, *bound])
            rows = envelope_texts(run.pk, run.session_id, cursor.fetchall())
    last_seq, terminal, has_more = _page_state(run, after_seq, rows[-1][:2] if rows else None, upto)
    return EncodedPage(rows=rows, last_seq=last_seq, terminal=terminal, has_more=has_more)


# SQLite: a page's rows with the size of each stored payload, in characters (`size`).
_SIZE = ", length({payload}) AS size"


def _within_chars(page_sql: str, columns: str, size: str = "size") -> str:
    """`page_sql` (rows in seq order) cut where its payloads (`size`, characters) reach a parameter.

    A row is kept while the payloads before it are under the bound, so the first always is.
    The database reads the page's rows (bounded in count) but returns only these.
    """
    return (
        f"SELECT {columns} FROM (SELECT {columns}, {size} AS chars, sum({size}) OVER "
        f"(ORDER BY seq ROWS UNBOUNDED PRECEDING) AS through FROM ({page_sql}) page) sized "
        "WHERE through - chars < %s ORDER BY seq"
    )


def _page_state(
    run: Run, after_seq: int, last_row: tuple[int, bool] | None, upto: int | None = None
) -> tuple[int, bool, bool]:
    """(last_seq, terminal, has_more) of a page whose last row is (seq, terminal), or None if empty."""
    last = last_row[0] if last_row else after_seq
    end = run.last_seq if upto is None else min(upto, run.last_seq)
    return (
        max(run.last_seq, last),
        run.is_terminal or bool(last_row and last_row[1]),
        last_row is not None and last < end,
    )


@dataclass
class EncodedArray:
    """A page of one run's envelopes as one JSON array's text (the polling API's body)."""

    text: str
    last_seq: int
    terminal: bool
    has_more: bool
    next_after: int  # the cursor for the page after this one: its last seq (or the request's, if empty)


def read_encoded_array(run: Run, after_seq: int = 0, limit: int | None = None) -> EncodedArray:
    """read_encoded's page as one JSON array; CursorAhead/CursorExpired.

    On SQLite the database builds the whole array (each envelope as `read_encoded` spells
    it, then group_concat): no Python object per event, which is most of a page's cost there.
    """
    max_chars = settings.HERMESWEB_EVENTS_PAGE_CHARS
    if connection.vendor != "sqlite":
        page = read_encoded(run, after_seq, limit, max_chars=max_chars)
        next_after = page.rows[-1][0] if page.rows else after_seq
        return EncodedArray(page.json_array(), page.last_seq, page.terminal, page.has_more, next_after)
    check_cursor(run, after_seq)
    limit = min(limit or settings.HERMESWEB_EVENTS_PAGE_MAX, settings.HERMESWEB_EVENTS_PAGE_MAX)
    where, params = _page_bounds(run, after_seq, limit)
    args = [*envelope_parts(run.pk, run.session_id), *params, limit]
    with connection.cursor() as cursor:
        try:
            # Most pages are far under the bound, and SQLite's window function costs more than
            # the page itself: the whole array, refused (DataError) once it would pass the bound
            # in bytes; only a page that does is read again, cut where its payloads reach it.
            with _sqlite_string_limit(max_chars):
                cursor.execute(_sqlite_array_sql(where, bounded=False), args)
                count, last, terminal, text = cursor.fetchone()
        except DataError:
            cursor.execute(_sqlite_array_sql(where, bounded=True), [*args, max_chars])
            count, last, terminal, text = cursor.fetchone()
    last_seq, final, has_more = _page_state(run, after_seq, (last, bool(terminal)) if count else None)
    text = f"[{text}]" if count else "[]"
    return EncodedArray(text, last_seq, final, has_more, next_after=last if count else after_seq)


@contextmanager
def _sqlite_string_limit(max_bytes: int) -> Iterator[None]:
    """Within it, SQLite refuses to make a string or blob longer than `max_bytes` (DataError)."""
    sqlite = connection.connection
    before = sqlite.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max_bytes)
    try:
        yield
    finally:
        sqlite.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, before)


@lru_cache(maxsize=8)
def _sqlite_array_sql(where: str, *, bounded: bool) -> str:
    # The rows in seq order (the subqueries' ORDER BY and LIMIT keep them from being flattened
    # into the aggregate). Only the last event of a run can be terminal.
    page = sql_for(
        f"SELECT {{seq}} AS seq, {{terminal}} AS terminal, {_sqlite_envelope()} AS envelope"
        f"{_SIZE if bounded else ''} FROM {{event}} WHERE {where} ORDER BY {{seq}} LIMIT %s"
    )
    if bounded:
        page = _within_chars(page, "seq, terminal, envelope")
    return f"SELECT count(*), max(seq), max(terminal), group_concat(envelope, ',') FROM ({page})"


@lru_cache(maxsize=1)
def _sqlite_envelope() -> str:
    # The text the row was written with, else (an older row, or one compaction rewrote) spelled
    # exactly as `envelope_texts` spells it (a test compares the two byte for byte), around the
    # two parameters `envelope_parts` gives.
    return (
        "COALESCE({envelope_json}, "
        '%s || {seq} || \'","seq":\' || {seq} || %s || json_quote({type}) || \',"created_at":\' || '
        + _SQLITE_EPOCH
        + ' || CASE WHEN {terminal} THEN \',"terminal":true,"payload":\' '
        "ELSE ',\"terminal\":false,\"payload\":' END || {payload} || '}}')"
    )


# The whole seconds (strftime's %s is computed in milliseconds, rounded: it gets only those;
# unixepoch, from SQLite 3.38, costs less), then the stored fraction as it is: what
# `epoch_of_stored_text` computes in Python.
_SQLITE_WHOLE_SECONDS = (
    "unixepoch(substr({created_at}, 1, 19))"
    if sqlite3.sqlite_version_info >= (3, 38)
    else "strftime('%%s', substr({created_at}, 1, 19))"
)
_SQLITE_EPOCH = (
    f"({_SQLITE_WHOLE_SECONDS} || "
    "CASE WHEN length({created_at}) > 19 THEN substr({created_at}, 20, 7) ELSE '.0' END)"
)


def _parse_sqlite_datetime(value: Any) -> Any:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value is not None and value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value


def check_cursor(run: Run, after_seq: int) -> None:
    if after_seq < 0:
        raise CursorAhead(f"cursor {after_seq} is negative")
    if after_seq > run.last_seq:
        raise CursorAhead(f"cursor {after_seq} is beyond run {run.pk}'s last seq {run.last_seq}")
    if 0 < after_seq < run.compacted_through:
        raise CursorExpired(
            f"events of run {run.pk} up to seq {run.compacted_through} were compacted; reload the transcript"
        )


def envelopes(events: Iterable[JournalEvent], session_id: int) -> list[dict[str, Any]]:
    return [event.envelope(session_id) for event in events]
