"""Reading a run's journal after a cursor: pages for the API, the socket's catch-up, replays.

Design note: docs/journal.md ("Reading"). A cursor is exclusive (`seq > after_seq`); one the
run never reached is CursorAhead, one inside the compacted range CursorExpired.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from django.conf import settings
from django.db import connection

from runs.journal.events import CursorAhead, CursorExpired
from runs.journal.rows import saved_event, sql_for
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
        return "[" + ",".join(text for _, _, text in self.rows) + "]"


def read_encoded(
    run: Run, after_seq: int = 0, limit: int | None = None, upto: int | None = None
) -> EncodedPage:
    """read_after, but each envelope comes back as its JSON text, built without decoding the payload.

    Catch-up is the hottest read there is (a reconnecting client may ask for a whole
    run): decoding each payload only to encode it again costs more than the query.
    PostgreSQL hands jsonb back as text and the epoch as a double; SQLite stores both
    as text already. Each text parses to exactly `JournalEvent.envelope()`.
    """
    check_cursor(run, after_seq)
    limit = min(limit or settings.HERMESWEB_EVENTS_PAGE_MAX, settings.HERMESWEB_EVENTS_PAGE_MAX)
    if upto is not None:
        limit = min(limit, max(upto - after_seq, 1))
    where, params = _page_bounds(run, after_seq, limit)
    vendor = connection.vendor
    sql = sql_for(
        f"SELECT {{seq}}, {{type}}, {_EPOCH_TEXT[vendor]}, {{terminal}}, {_JSON_TEXT[vendor]} "
        f"FROM {{event}} WHERE {where} ORDER BY {{seq}} LIMIT %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, limit])
        fetched = cursor.fetchall()
    head = f'{{"event_id":"{run.pk}:'
    ids = f',"run_id":{run.pk},"session_id":{run.session_id},"type":'
    types: dict[str, str] = {}
    rows: list[tuple[int, bool, str]] = []
    for seq, type_, epoch, terminal, payload in fetched:
        type_json = types.get(type_) or types.setdefault(type_, orjson.dumps(type_).decode())
        rows.append(
            (
                seq,
                bool(terminal),
                f'{head}{seq}","seq":{seq}{ids}{type_json},"created_at":{epoch},'
                f'"terminal":{"true" if terminal else "false"},"payload":{payload}}}',
            )
        )
    last = rows[-1][0] if rows else after_seq
    end = run.last_seq if upto is None else min(upto, run.last_seq)
    return EncodedPage(
        rows=rows,
        last_seq=max(run.last_seq, last),
        terminal=run.is_terminal or bool(rows and rows[-1][1]),
        has_more=bool(rows) and last < end,
    )


# created_at as the text of a JSON number, computed by the database: formatting a float per
# row in Python cost more than the rest of the page. Both are the exact decimal of the stored
# microseconds, so a JSON parser reads them as the same double as `created_at.timestamp()`
# (both roundings are correct ones). SQLite stores "YYYY-MM-DD HH:MM:SS[.ffffff]", naive UTC.
_EPOCH_TEXT = {
    "postgresql": "EXTRACT(EPOCH FROM {created_at})::text",
    # strftime's %s is computed in milliseconds, rounded: it gets only the whole seconds.
    "sqlite": "strftime('%%s', substr({created_at}, 1, 19)) || "
    "CASE WHEN length({created_at}) > 19 THEN substr({created_at}, 20, 7) ELSE '.0' END",
}
# PostgreSQL decodes jsonb into Python objects unless asked for its text; SQLite stores text.
_JSON_TEXT = {"postgresql": "{payload}::text", "sqlite": "{payload}"}


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
