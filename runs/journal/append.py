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
from functools import lru_cache
from typing import Any

import psycopg
from django.db import connection, transaction
from django.utils import timezone

from runs.journal.events import TERMINAL_STATES, AlreadyTerminal, Appended, JournalError, NewEvent
from runs.journal.rows import dump_json, insert, saved_event, sql_for
from runs.models import JournalEvent, Run, RunStatus
from runs.notify.sending import publish_on_commit
from runs.redaction import redact


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
            publish_on_commit(_publish, session_id, run_id, envelopes)
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
        rows = insert(
            [
                (run_id, last_seq + offset, event.type, event.terminal, redact(event.payload))
                for offset, event in enumerate(events, start=1)
            ],
            now,
            {run_id: session_id},
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
            cursor.execute(sql_for(_STATUS_OF), [group.missing])
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
            await cursor.execute(sql_for(_STATUS_OF), [group.missing])
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
            [dump_json(row[4]) for row in self.planned],
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
                saved[run_id].append(saved_event(alias, pk, run_id, seq, type_, self.now, terminal, payload))
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
    return sql_for(
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


def _take_seqs(run_id: int, count: int) -> tuple[int, str, int]:
    """Reserve `count` seqs of a run that has not ended: (session_id, status, last seq before them).

    One statement moves `last_seq` and row-locks the run until the transaction ends
    (SQLite's IMMEDIATE transactions serialise writers anyway), so concurrent appends
    queue here and each gets the seqs after the previous one's. Raises AlreadyTerminal
    for an ended run and Run.DoesNotExist for a missing one.
    """
    ended = ", ".join(["%s"] * len(TERMINAL_STATES))
    sql = sql_for(
        "UPDATE {run} SET {last_seq} = {last_seq} + %s "
        f"WHERE {{id}} = %s AND {{status}} NOT IN ({ended}) "
        "RETURNING {session_id}, {status}, {last_seq}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [count, run_id, *sorted(TERMINAL_STATES)])
        row = cursor.fetchone()
        if row is None:
            cursor.execute(sql_for("SELECT {status} FROM {run} WHERE {id} = %s"), [run_id])
            found = cursor.fetchone()
            if found is None:
                raise Run.DoesNotExist(f"Run {run_id} does not exist.")
            # The terminal event is the last one a run ever gets.
            raise AlreadyTerminal(f"run {run_id} already ended ({found[0]})")
    return int(row[0]), str(row[1]), int(row[2]) - count


def _publish(session_id: int, run_id: int, envelopes: list[dict[str, Any]]) -> None:
    from runs import notify

    notify.publish_events(session_id, run_id, envelopes)


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
    return [(event.type, json.loads(dump_json(redact(event.payload)))) for event in events]
