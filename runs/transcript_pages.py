"""Pages of a session's turns: each run's folded state within a byte budget, and the folds kept.

Design note: docs/journal.md ("Transcript"). The fold itself is runs/transcript.py (the twin of
static/js/runstate.js); here is what bounds it for a page: the budgets, the SQL size checks that
spare folding a run plainly too large, the cache of finished runs' folds, and the tail a long
run opens at.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import orjson
from django.db import connection
from django.db.models import Max, Sum, TextField
from django.db.models.functions import Cast, Length

from runs.journal.rows import sql_for
from runs.models import TERMINAL_STATUSES, JournalEvent, Run
from runs.transcript import Fold, empty_state

# A page of turns (the transcript API, the session's rendered fragments): its default and largest
# number of turns. Its bytes are bounded too: see `page_turns`.
PAGE_TURNS = 30
PAGE_TURNS_MAX = 100
# A run with at least this many events is size-checked in SQL before it is folded for a page that
# would throw its cut state away: smaller runs fold in milliseconds, the check would cost more.
SIZE_CHECK_EVENTS = 2000
# The database's text of a payload (`jsonb::text`, or SQLite's stored JSON) has a space after each
# `:` and `,` that orjson leaves out, so it can be up to ~1.5x the compact bytes: over twice the
# budget in SQL is over the budget for certain.
SIZE_CHECK_SLACK = 2
# A page's turn states leave these out (`page_state`): each is the join of the state's items.
PAGE_OMITS = frozenset({"text", "reasoning"})
# Folds of finished runs kept per process (`FoldCache`), at most this many payload bytes in all:
# a long run's page is then a read (its fold was most of a 100k-event page's request).
FOLD_CACHE_BYTES = 32 * 1024 * 1024
# A finished run larger than its page opens at its end with at most this much of it (`tail_within`):
# many screens, and a fraction of a whole page to send, parse and lay out before it is usable.
TAIL_BYTES = 256 * 1024


class PagedTurn(NamedTuple):
    run: Run
    state: dict[str, Any]
    # False: `state` stops at state["last_seq"] to keep the page bounded; the rest of the run is
    # in its journal (GET /api/runs/{id}/events, or the socket from that cursor).
    complete: bool
    # A finished run larger than the page comes from its end: its first `items_from` items are
    # left out of `state` (`items_before` reads them, a page at a time).
    items_from: int = 0


class TurnsPage(NamedTuple):
    turns: list[PagedTurn]  # in the order asked for
    # Runs were left out: past the page's turn limit or its byte budget.
    stopped: bool


def turn_cost(run: Run) -> int:
    return len(run.prompt_text) + len(run.error or "")


def page_turns(
    runs: Sequence[Run], budget: int, *, skip_oversized: bool = False, cut_states: bool = True
) -> TurnsPage:
    """Materialize `runs` in order until their prompts and event payloads reach `budget` bytes.

    The first run always goes in, cut short (`complete` False) when it alone passes the budget;
    with `skip_oversized` such a run comes with an empty state instead and the page goes on. Each run's events
    are read with an iterator, so a page holds at most about `budget` of them at a time; its
    JSON (`page_state`) stays under about that plus one prompt.
    `cut_states` False: a cut run comes with an empty state (its rendered fragment is "too
    large" either way), so a run plainly over the budget is not folded at all.
    """
    turns: list[PagedTurn] = []
    spent = 0
    for index, run in enumerate(runs):
        cost = turn_cost(run)
        if turns and spent + cost > budget:
            return TurnsPage(turns, True)
        # The cut state is kept only for the page's first run, and only when asked for.
        keep_cut = cut_states and not turns and not skip_oversized
        fold = fold_for_page(run, budget - spent - cost, keep_cut=keep_cut)
        if not fold.complete and turns:
            return TurnsPage(turns, True)
        if not fold.complete and skip_oversized:
            turns.append(PagedTurn(run, empty_state(), False))
            continue
        turns.append(PagedTurn(run, fold.state, fold.complete, fold.items_from))
        if not fold.complete or fold.items_from:
            # The page ends with it: runs were left out only if more were asked for.
            return TurnsPage(turns, index + 1 < len(runs))
        spent += cost + fold.used
    return TurnsPage(turns, False)


def page_state(state: dict[str, Any]) -> dict[str, Any]:
    """A turn's state as a transcript page sends it: without the run's whole `text` and
    `reasoning`, which are its text and reasoning items joined (the page would carry them twice)."""
    return {key: value for key, value in state.items() if key not in PAGE_OMITS}


class StoredSize(NamedTuple):
    """A run's payloads as stored: their text's length in all, and the last event's seq."""

    chars: int
    last_seq: int
    compacted_through: int

    def plainly_over(self, budget: int) -> bool:
        """Whether a fold certainly passes `budget` before the end.

        A fold cuts a run iff its payloads pass the budget and its last event lies past the
        compacted range (a cut never falls inside it); see `fold_within`.
        """
        return self.chars > SIZE_CHECK_SLACK * budget and self.last_seq > self.compacted_through


def stored_size(run: Run, *, short: bool = False) -> StoredSize:
    """The run's `StoredSize` from one aggregate query; nothing for a run too short to matter
    unless `short` (one known to pass a page all the same)."""
    if run.last_seq < SIZE_CHECK_EVENTS and not short:
        return StoredSize(0, 0, run.compacted_through)
    sizes = JournalEvent.objects.filter(run=run).aggregate(
        chars=Sum(Length(Cast("payload", TextField()))), last=Max("seq")
    )
    return StoredSize(sizes["chars"] or 0, sizes["last"] or 0, run.compacted_through)


def plainly_over(run: Run, budget: int) -> bool:
    """Whether the run's events certainly pass `budget` before the end (`StoredSize.plainly_over`)."""
    return stored_size(run).plainly_over(budget)


class WholeFold(NamedTuple):
    """A finished run's whole fold, as `fold_cache` keeps it."""

    state: dict[str, Any]  # shared between pages: read it, never change it
    used: int  # its payloads' bytes, as `fold_within` counts them against a budget
    item_sizes: list[int]  # the JSON bytes of each of `state["items"]`


class PageFold(NamedTuple):
    """A run's state as one page carries it (`fold_for_page`)."""

    state: dict[str, Any]
    used: int
    complete: bool  # False: `state` stops at its last_seq (PagedTurn.complete)
    items_from: int  # the run's items left out before `state["items"]` (PagedTurn.items_from)


class ItemsPage(NamedTuple):
    items: list[dict[str, Any]]
    items_from: int  # the index of `items[0]` in the run's items; 0: none are left before


class FoldCache:
    """Whole folds of finished runs, least recently used out first, at most `limit` payload bytes.

    A finished run's fold never changes: its journal is append-only, and compaction, which
    rewrites its rows, moves `compacted_through` (part of the key; the fold itself is the same).
    A later event moves `last_seq`; `created_at` tells apart two runs given one id in turn (a
    test database's rolled-back rows).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.spent = 0
        self.entries: OrderedDict[tuple[Any, ...], WholeFold] = OrderedDict()
        self.lock = threading.Lock()

    @staticmethod
    def key(run: Run) -> tuple[Any, ...] | None:
        """The key of a run's fold, or None when it is not kept (a run going on; a small one,
        which folds in milliseconds)."""
        if run.status not in TERMINAL_STATUSES or run.last_seq < SIZE_CHECK_EVENTS:
            return None
        return (run.pk, run.created_at, run.last_seq, run.compacted_through)

    def get(self, key: tuple[Any, ...]) -> WholeFold | None:
        with self.lock:
            found = self.entries.get(key)
            if found is not None:
                self.entries.move_to_end(key)
            return found

    def put(self, key: tuple[Any, ...], value: WholeFold) -> None:
        cost = max(value.used, 1)
        if cost > self.limit:
            return
        with self.lock:
            if key in self.entries:
                return
            self.entries[key] = value
            self.spent += cost
            while self.spent > self.limit:
                _, dropped = self.entries.popitem(last=False)
                self.spent -= max(dropped.used, 1)

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
            self.spent = 0


fold_cache = FoldCache(FOLD_CACHE_BYTES)


def whole_fold(run: Run) -> WholeFold:
    """A run's whole fold with its items' sizes, from `fold_cache` for a finished run folded before."""
    key = FoldCache.key(run)
    found = fold_cache.get(key) if key is not None else None
    if found is None:
        state, used, _ = fold_within(run, budget=None)
        found = WholeFold(state, used, [len(orjson.dumps(item)) for item in state["items"]])
        if key is not None:
            fold_cache.put(key, found)
    return found


def fold_for_page(run: Run, room: int, *, keep_cut: bool) -> PageFold:
    """A run's state within `room` payload bytes.

    A finished run that fits comes whole (`fold_within`'s answer; a long one's is kept in
    `fold_cache`). One that does not comes from its end when `keep_cut` (its last items,
    `tail_within`), so a reader sees where it ended at once; otherwise, as a run going on does,
    cut at the budget.
    """
    if not run.is_terminal:
        return PageFold(*fold_within(run, room, keep_cut=keep_cut), 0)
    key = FoldCache.key(run)
    if key is None or fold_cache.get(key) is None:
        head = None
        if key is None:
            # A short run: folding it within the page costs less than asking its size first.
            head = PageFold(*fold_within(run, room, keep_cut=keep_cut), 0)
            if head.complete or not keep_cut:
                return head
        size = stored_size(run, short=True)
        if not keep_cut and size.plainly_over(room):
            return PageFold(empty_state(), 0, False, 0)  # its size says enough: it is not folded
        if size.plainly_over(fold_cache.limit // SIZE_CHECK_SLACK):
            # Too large to keep: folding it whole on every open would cost the run's size each time.
            return head or PageFold(*fold_within(run, room, keep_cut=keep_cut), 0)
    whole = whole_fold(run)
    if whole.used <= room:
        return PageFold(whole.state, whole.used, True, 0)
    if not keep_cut:
        return PageFold(empty_state(), 0, False, 0)
    tail = tail_within(whole, room, TAIL_BYTES)
    if tail is not None:
        return tail
    # An item larger than the page on its own: the run's start, read on from its journal.
    state, used, complete = fold_within(run, room)
    return PageFold(state, used, complete, 0)


def tail_within(whole: WholeFold, room: int, want: int) -> PageFold | None:
    """The run's state with only its last items within `want` bytes (at least its last item);
    None when one of its items alone passes `room` (reading back a page at a time would stop there)."""
    sizes = whole.item_sizes
    if not sizes or max(sizes) > room:
        return None
    start, used = len(sizes), 0
    while start and (start == len(sizes) or used + sizes[start - 1] <= min(room, want)):
        start -= 1
        used += sizes[start]
    return PageFold(tail_state(whole.state, start), used, True, start)


def tail_state(state: dict[str, Any], start: int) -> dict[str, Any]:
    """`state` from its item `start` on: its indexes (tools, approvals, ...) hold only those items,
    its errors too, and the run's last error (the turn's banner gives it as the reason)."""
    items = state["items"][start:]
    errors = [item for item in items if item["kind"] == "error"]
    if state["errors"] and not errors:
        errors = state["errors"][-1:]
    return {
        **state,
        "items": items,
        "text": "".join(item["text"] for item in items if item["kind"] == "text"),
        "reasoning": "".join(item["text"] for item in items if item["kind"] == "reasoning"),
        "tools": {item["tool_call_id"]: item for item in items if item["kind"] == "tool"},
        "approvals": {item.get("approval_id"): item for item in items if item["kind"] == "approval"},
        "clarifications": {item.get("clarify_id"): item for item in items if item["kind"] == "clarify"},
        "steers": [item for item in items if item["kind"] == "steer"],
        "errors": errors,
    }


class TooLargeToReadBack(Exception):
    """The run is too large to keep folded (`fold_for_page` never opens it at its end)."""


def items_before(run: Run, before: int, budget: int) -> ItemsPage:
    """The run's items before index `before`, the nearest ones within `budget` bytes (at least one).

    For a page come from its end (`tail_within`): its earlier items, read back a page at a time.
    TooLargeToReadBack for a run too large to keep: each page would fold all of it again.
    """
    key = FoldCache.key(run)
    kept = key is not None and fold_cache.get(key) is not None
    if not kept and stored_size(run, short=True).plainly_over(fold_cache.limit // SIZE_CHECK_SLACK):
        raise TooLargeToReadBack(f"run {run.pk} is too large to read back by items")
    whole = whole_fold(run)
    end = max(0, min(before, len(whole.item_sizes)))
    start, used = end, 0
    while start and (start == end or used + whole.item_sizes[start - 1] <= budget):
        start -= 1
        used += whole.item_sizes[start]
    return ItemsPage(whole.state["items"][start:end], start)


def fold_within(run: Run, budget: int | None, *, keep_cut: bool = True) -> tuple[dict[str, Any], int, bool]:
    """A run's state from its events while their payloads fit `budget` (None: no bound):
    (state, bytes used, complete).

    A cut never falls inside the compacted range: a cursor there could not be read on from.
    `keep_cut` False: a cut run's state is not wanted, so one plainly over comes empty, unread.
    """
    if budget is not None and not keep_cut and plainly_over(run, budget):
        return empty_state(), 0, False
    fold, used = Fold(), 0
    for seq, kind, raw, terminal in _event_rows(run):
        payload = parse_payload(raw)
        size = len(orjson.dumps(payload))
        if budget is not None and used + size > budget and seq > run.compacted_through:
            return fold.finish(), used, False
        fold.add({"seq": seq, "type": kind, "payload": payload, "terminal": bool(terminal)})
        used += size
    return fold.finish(), used, True


def _event_rows(run: Run) -> Iterator[tuple[int, str, str | None, Any]]:
    """The run's (seq, type, payload JSON text, terminal) in order, streamed 500 at a time.

    Tuples from the driver, the payload parsed by orjson: model instances and the JSONField's
    json.loads were most of a long run's page (bench/README, issue 25), and the ORM's per-row
    converters a fifth of a whole fold (round sixteen). A server-side cursor on PostgreSQL, as
    the ORM's iterator takes, unless the database is set to do without (a transaction pooler).
    """
    text = "CAST({payload} AS TEXT)" if connection.vendor == "sqlite" else "{payload}::text"
    sql = sql_for(
        f"SELECT {{seq}}, {{type}}, {text}, {{terminal}} FROM {{event}} "
        "WHERE {run_id} = %s ORDER BY {seq}"
    )
    plain = connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS")
    with connection.cursor() if plain else connection.chunked_cursor() as cursor:
        cursor.execute(sql, [run.pk])
        while rows := cursor.fetchmany(500):
            yield from rows


def parse_payload(raw: str | None) -> Any:
    """A payload's stored JSON text as the JSONField would load it."""
    if raw is None:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:  # NaN or Infinity, which Python's json writes and orjson refuses
        return json.loads(raw)


class TranscriptPage(NamedTuple):
    turns: list[PagedTurn]  # oldest first
    has_more: bool  # older turns exist: ask again with `before` = the first turn's run id


def newest_turns(
    session_id: int,
    *,
    before: int | None,
    limit: int,
    budget: int,
    after: int | None = None,
    cut_states: bool = True,
) -> TranscriptPage:
    """The session's newest turns older than run `before` and newer than run `after` (None: no
    bound), one bounded page.

    Run ids grow with the session's turns (they are created under the session's lock), so they
    order the pages and serve as their cursor.
    """
    runs = Run.objects.filter(session_id=session_id)
    if before is not None:
        runs = runs.filter(pk__lt=before)
    if after is not None:
        runs = runs.filter(pk__gt=after)
    newest = list(runs.order_by("-pk")[: limit + 1])
    page = page_turns(newest[:limit], budget, cut_states=cut_states)
    return TranscriptPage(page.turns[::-1], page.stopped or len(newest) > limit)
