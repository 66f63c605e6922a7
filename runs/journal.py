"""The journal: append-only, per-run `seq`, exactly one terminal event.

Design note: docs/journal.md. Appends move `run.last_seq` first (one UPDATE …
RETURNING, which row-locks the run on PostgreSQL; SQLite's IMMEDIATE
transactions serialise writers), insert the batch with the seqs it reserved, all
in one transaction, so seq has neither gaps nor duplicates whoever appends. Events are
published to the channel layer only after the transaction commits.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, NamedTuple

import orjson
import psycopg
from django.conf import settings
from django.db import connection, transaction
from django.db.models.base import ModelState
from django.utils import timezone

from runs.models import TERMINAL_STATUSES, EventType, JournalEvent, Run, RunStatus
from runs.redaction import redact

TERMINAL_STATES = {s.value for s in TERMINAL_STATUSES}


class JournalError(Exception):
    code = "journal_error"


class AlreadyTerminal(JournalError):
    code = "already_terminal"


class CursorAhead(JournalError):
    code = "cursor_ahead"


class CursorExpired(JournalError):
    code = "cursor_expired"


class Appended(NamedTuple):
    """A batch as written: its rows with their seqs, and the run's session."""

    rows: list[JournalEvent]
    session_id: int


@dataclass
class NewEvent:
    type: str
    payload: dict[str, Any] = field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        return self.type == EventType.DONE


def done_event(state: str, **payload: Any) -> NewEvent:
    if state not in TERMINAL_STATES:
        raise ValueError(f"terminal state must be one of {sorted(TERMINAL_STATES)}, got {state!r}")
    return NewEvent(EventType.DONE, {"state": state, **payload})


def append_batch(
    run_id: int, events: Sequence[NewEvent], *, publish: bool = True, **run_updates: Any
) -> list[JournalEvent]:
    """Append events atomically and return them with their seq.

    `run_updates` are written to the Run row in the same transaction (status,
    stop_reason, usage …). A `done` event must be last; it sets the run's
    terminal status and finish time, and a second terminal raises AlreadyTerminal.
    """
    if not events:
        return []
    with transaction.atomic():
        rows, session_id = append_unpublished(run_id, events, **run_updates)
        if publish:
            envelopes = [row.envelope(session_id) for row in rows]
            transaction.on_commit(lambda: _publish(session_id, run_id, envelopes))
    return rows


def append_unpublished(run_id: int, events: Sequence[NewEvent], **run_updates: Any) -> Appended:
    """append_batch without the publish; call inside atomic().

    For a caller on an event loop (runs.runner.writer) that publishes itself once its
    transaction has committed, instead of having the database thread hop back to
    the loop and wait there for every commit's notification.
    """
    if not events:
        return Appended([], 0)
    for index, event in enumerate(events):
        if event.terminal and index != len(events) - 1:
            raise ValueError("a done event must be the last of its batch")
    if connection.vendor == "postgresql" and not run_updates and not events[-1].terminal:
        # Plain events: the group's one statement, for a group of one.
        result = append_group_unpublished([(run_id, events)])[0]
        if isinstance(result, Exception):
            raise result
        return result
    # No savepoint: the caller's atomic() is the transaction, and an error here ends it anyway.
    with transaction.atomic(savepoint=False):
        session_id, status, last_seq = _take_seqs(run_id, len(events))
        terminal = events[-1] if events[-1].terminal else None
        now = timezone.now()
        rows = _insert(
            [
                (run_id, last_seq + offset, event.type, event.terminal, redact(event.payload))
                for offset, event in enumerate(events, start=1)
            ],
            now,
        )
        updates: dict[str, Any] = dict(run_updates)
        if status == RunStatus.CANCELLING and updates.get("status") not in (None, *TERMINAL_STATES):
            # A cancel was requested: only a terminal state may replace it.
            del updates["status"]
        if terminal is not None:
            updates.setdefault("status", terminal.payload["state"])
            updates.setdefault("finished_at", now)
            updates["lease_owner"] = ""
            updates["lease_expires_at"] = None
        if updates:
            Run.objects.filter(pk=run_id).update(**updates)
    return Appended(rows, session_id)


GroupResult = Appended | JournalError | Run.DoesNotExist


def append_group_unpublished(items: Sequence[tuple[int, Sequence[NewEvent]]]) -> list[GroupResult]:
    """append_unpublished for the batches of several runs; per item Appended or a refusal.

    A run that ended or does not exist refuses its batch (nothing is written for it; the
    others go on). No run updates, and no terminal event: those take append_unpublished.

    On PostgreSQL the whole group is one statement, the seqs of every run (one UPDATE) and
    every row (one INSERT) joined in a data-modifying CTE: inside a transaction it is part
    of the caller's; outside one it commits by itself, so a group costs one round trip.
    SQLite has no round trips to save: it appends run by run, in the caller's transaction.
    """
    if connection.vendor != "postgresql":
        _check_group(items)
        return [_append_or_refusal(run_id, events) for run_id, events in items]
    group = _Group(items)
    with connection.cursor() as cursor:
        cursor.execute(_group_statement(), group.params)
        group.read(cursor.fetchall())
        found: dict[int, str] = {}
        if group.missing:
            cursor.execute(_sql(_STATUS_OF), [group.missing])
            found = dict(cursor.fetchall())
    return group.results(connection.alias, found)


async def aappend_group_unpublished(
    conn: psycopg.AsyncConnection[Any], items: Sequence[tuple[int, Sequence[NewEvent]]]
) -> list[GroupResult]:
    """append_group_unpublished on PostgreSQL through a psycopg connection in autocommit, in
    the caller's event loop (the runner's: writer.GroupCommit), so no thread hop is paid."""
    group = _Group(items)
    async with conn.cursor() as cursor:
        await cursor.execute(_group_statement(), group.params)
        group.read(await cursor.fetchall())
        found: dict[int, str] = {}
        if group.missing:
            await cursor.execute(_sql(_STATUS_OF), [group.missing])
            found = dict(await cursor.fetchall())
    return group.results(connection.alias, found)


_STATUS_OF = "SELECT {id}, {status} FROM {run} WHERE {id} = ANY(%s)"


def _check_group(items: Sequence[tuple[int, Sequence[NewEvent]]]) -> None:
    runs = [run_id for run_id, _ in items]
    if len(set(runs)) != len(runs):
        raise ValueError("a group holds at most one batch per run")
    for _, events in items:
        if not events or any(event.terminal for event in events):
            raise ValueError("a group batch is non-empty and has no terminal event")


class _Group:
    """One group statement's parameters, and its rows read back into results."""

    def __init__(self, items: Sequence[tuple[int, Sequence[NewEvent]]]) -> None:
        _check_group(items)
        self.runs = [run_id for run_id, _ in items]
        self.now = timezone.now()
        # Per row: run id, its place in its run's batch (from 1), type, terminal, redacted payload.
        self.planned = [
            (run_id, offset, event.type, event.terminal, redact(event.payload))
            for run_id, events in items
            for offset, event in enumerate(events, start=1)
        ]
        # Ordered by id, so concurrent groups lock runs in the same order.
        order = sorted(range(len(items)), key=lambda i: self.runs[i])
        self.params = [
            [self.runs[i] for i in order],
            [len(items[i][1]) for i in order],
            *sorted(TERMINAL_STATES),
            connection.ops.adapt_datetimefield_value(self.now),
            *([row[i] for row in self.planned] for i in range(4)),
            [_dump_json(row[4]) for row in self.planned],
        ]
        self.taken: dict[int, tuple[int, int]] = {}  # run id: (session id, its first new seq)
        self.ids: dict[tuple[int, int], int] = {}
        self.missing: list[int] = []

    def read(self, fetched: Iterable[tuple[Any, ...]]) -> None:
        for is_event, pk, a, b in fetched:
            if is_event:
                self.ids[(a, b)] = pk
            else:
                self.taken[pk] = (a, b)
        self.missing = [run_id for run_id in self.runs if run_id not in self.taken]

    def results(self, alias: str, found: dict[int, str]) -> list[GroupResult]:
        saved: dict[int, list[JournalEvent]] = {run_id: [] for run_id in self.taken}
        for run_id, offset, type_, terminal, payload in self.planned:
            if run_id in self.taken:
                seq = self.taken[run_id][1] + offset - 1
                pk = self.ids.get((run_id, seq))
                saved[run_id].append(_saved_event(alias, pk, run_id, seq, type_, self.now, terminal, payload))
        results: list[GroupResult] = []
        for run_id in self.runs:
            if run_id in self.taken:
                results.append(Appended(saved[run_id], self.taken[run_id][0]))
            elif run_id in found:
                results.append(AlreadyTerminal(f"run {run_id} already ended ({found[run_id]})"))
            else:
                results.append(Run.DoesNotExist(f"Run {run_id} does not exist."))
        return results


@lru_cache(maxsize=1)  # PostgreSQL only; built once, not on every append
def _group_statement() -> str:
    ended = ", ".join(["%s"] * len(TERMINAL_STATES))
    return _sql(
        "WITH u AS (SELECT * FROM unnest(%s::bigint[], %s::integer[]) AS u(id, n)), "
        "taken AS ("
        "UPDATE {run} SET {last_seq} = {run}.{last_seq} + u.n FROM u "
        f"WHERE {{run}}.{{id}} = u.id AND {{run}}.{{status}} NOT IN ({ended}) "
        "RETURNING {run}.{id}, {run}.{session_id}, {run}.{last_seq} - u.n + 1 AS first), "
        "saved AS ("
        "INSERT INTO {event} ({run_id}, {seq}, {type}, {created_at}, {terminal}, {payload}) "
        "SELECT e.run_id, t.first + e.place - 1, e.type, %s, e.terminal, e.payload::jsonb "
        "FROM unnest(%s::bigint[], %s::integer[], %s::text[], %s::boolean[], %s::text[]) "
        "AS e(run_id, place, type, terminal, payload) JOIN taken t ON t.{id} = e.run_id "
        "RETURNING {id}, {run_id}, {seq}) "
        "SELECT false, {id}, {session_id}, first FROM taken "
        "UNION ALL SELECT true, {id}, {run_id}, {seq} FROM saved"
    )


def _append_or_refusal(run_id: int, events: Sequence[NewEvent]) -> GroupResult:
    try:
        return append_unpublished(run_id, events)
    except (AlreadyTerminal, Run.DoesNotExist) as exc:
        # Refused by a plain read before anything was written: the transaction is sound,
        # only atomic(savepoint=False) marked it for rollback on the way out.
        transaction.set_rollback(False)
        return exc


def _sql(template: str) -> str:
    return _format_sql(connection.vendor, template)


@lru_cache(maxsize=64)
def _format_sql(vendor: str, template: str) -> str:
    quote = connection.ops.quote_name
    return template.format(
        run=quote(Run._meta.db_table),
        event=quote(JournalEvent._meta.db_table),
        **{name: quote(name) for name in ("id", "session_id", "status", "last_seq", "seq", *_COLUMNS)},
    )


def _take_seqs(run_id: int, count: int) -> tuple[int, str, int]:
    """Reserve `count` seqs of a run that has not ended: (session_id, status, last seq before them).

    One statement moves `last_seq` and row-locks the run until the transaction ends
    (SQLite's IMMEDIATE transactions serialise writers anyway), so concurrent appends
    queue here and each gets the seqs after the previous one's. Raises AlreadyTerminal
    for an ended run and Run.DoesNotExist for a missing one.
    """
    ended = ", ".join(["%s"] * len(TERMINAL_STATES))
    sql = _sql(
        "UPDATE {run} SET {last_seq} = {last_seq} + %s "
        f"WHERE {{id}} = %s AND {{status}} NOT IN ({ended}) "
        "RETURNING {session_id}, {status}, {last_seq}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [count, run_id, *sorted(TERMINAL_STATES)])
        row = cursor.fetchone()
        if row is None:
            cursor.execute(_sql("SELECT {status} FROM {run} WHERE {id} = %s"), [run_id])
            found = cursor.fetchone()
            if found is None:
                raise Run.DoesNotExist(f"Run {run_id} does not exist.")
            # The terminal event is the last one a run ever gets.
            raise AlreadyTerminal(f"run {run_id} already ended ({found[0]})")
    return int(row[0]), str(row[1]), int(row[2]) - count


def _publish(session_id: int, run_id: int, envelopes: list[dict[str, Any]]) -> None:
    from runs import notify

    notify.publish_events(session_id, run_id, envelopes)


# Rows per INSERT statement on SQLite: 6 parameters a row stays far below its variable limit.
ROWS_PER_INSERT = 500
_COLUMNS = ("run_id", "seq", "type", "created_at", "terminal", "payload")


def _insert(rows: list[tuple[int, int, str, bool, Any]], now: Any) -> list[JournalEvent]:
    """Insert (run id, seq, type, terminal, payload) rows; returns them as saved models.

    bulk_create spent most of an append in per-field ORM preparation and
    JSONField's json.dumps. These rows are uniform, so the statement is fixed and
    values go to the driver as they are: on PostgreSQL as one array per column
    (`unnest`: a short statement whatever the batch size, no per-row literal to
    parse), on SQLite as one multi-row VALUES. Same table, columns and values
    as bulk_create wrote. Rows may belong to several runs (a group commit).
    """
    created_at = connection.ops.adapt_datetimefield_value(now)
    payloads = [_dump_json(row[4]) for row in rows]
    ids: dict[tuple[int, int], int] = {}
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                _sql(
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
                sql = _sql(
                    "INSERT INTO {event} ({run_id}, {seq}, {type}, {created_at}, {terminal}, {payload}) "
                )
                sql += "VALUES " + ", ".join(["(%s, %s, %s, %s, %s, %s)"] * len(chunk))
                if returning:
                    # Mapped by (run, seq): SQLite does not promise RETURNING in VALUES order.
                    cursor.execute(sql + _sql(" RETURNING {id}, {run_id}, {seq}"), params)
                    ids.update(((run_id, seq), pk) for pk, run_id, seq in cursor.fetchall())
                else:
                    cursor.execute(sql, params)
    alias = connection.alias
    return [
        _saved_event(alias, ids.get((run_id, seq)), run_id, seq, type_, now, terminal, payload)
        for run_id, seq, type_, terminal, payload in rows
    ]


def _saved_event(
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


def _dump_json(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        # What JSONField did (json.dumps) for what orjson refuses, e.g. integers beyond 64 bits.
        return json.dumps(value)


def written_after(run_id: int, after_seq: int) -> tuple[int, list[JournalEvent]]:
    """The run's session id and its committed rows after `after_seq`, in order.

    How a writer whose write went unanswered (the connection died under it) tells whether
    that write landed (runs.runner.writer, "exactly once").
    """
    session_id = Run.objects.values_list("session_id", flat=True).get(pk=run_id)
    return session_id, list(JournalEvent.objects.filter(run_id=run_id, seq__gt=after_seq).order_by("seq"))


def as_written(events: Sequence[NewEvent]) -> list[tuple[str, Any]]:
    """(type, payload) of each event as its row holds it: redacted, through JSON."""
    # json, not orjson, reads it back: as the JSONField reads the row (orjson reads an integer
    # beyond 64 bits as a float).
    return [(event.type, json.loads(_dump_json(redact(event.payload)))) for event in events]


def read_after(run: Run, after_seq: int = 0, limit: int | None = None) -> list[JournalEvent]:
    """Events with seq > after_seq, oldest first; raises CursorAhead/CursorExpired."""
    check_cursor(run, after_seq)
    limit = min(limit or settings.HERMESWEB_EVENTS_PAGE_MAX, settings.HERMESWEB_EVENTS_PAGE_MAX)
    alias = connection.alias
    return [
        _saved_event(alias, pk, run.pk, seq, type_, created_at, terminal, payload)
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
    sql = _sql(
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
    sql = _sql(
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
