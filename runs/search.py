"""Search across a user's sessions: prompts, answers and tool titles. Design: docs/search.md.

One `SearchDocument` per settled run, written from its materialized transcript just after the
transaction that records its terminal event commits (`index_on_commit`: `turns.finish_run`,
`discovery.write_import`). Each database indexes it its own way (migration 0004) and answers
`search()` with its own ranking and highlighting:

- PostgreSQL: a weighted `tsvector` column with a GIN index, `plainto_tsquery('english', …)`,
  ranked by `ts_rank_cd`, highlighted by `ts_headline`;
- SQLite (the embedded default): an FTS5 table (porter stemming), ranked by `bm25`,
  highlighted by `snippet`.

Both split words at ASCII punctuation (PostgreSQL reads it as spaces: migration 0004), so
`parser.py` is the words `parser` and `py` to either. The user's text never reaches either query
syntax: it is cut into its words (`terms`), bound as plain words (PostgreSQL) or quoted strings
(FTS5), all of them required.
"""

from __future__ import annotations

import html
import logging
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

import orjson
from django.db import connection, transaction
from django.utils import timezone

from projects.models import Session
from projects.refusals import Refused
from runs.models import TERMINAL_STATUSES, EventType, Run, SearchDocument
from runs.transcript import materialize

log = logging.getLogger(__name__)

# The 32 ASCII punctuation characters: word separators to both indexes (migration 0004).
PUNCTUATION = "".join(chr(c) for c in range(33, 127) if not chr(c).isalnum())
# Private-use characters: the highlighter's marks, and stand-ins for the punctuation while
# PostgreSQL highlights (so it splits words as its index did, and keeps `<tags>` instead of
# dropping them). Removed from the indexed text: an agent's text can never forge a mark.
MARK_START, MARK_END = "\ue000", "\ue001"
_STAND_INS = "".join(chr(0xE010 + i) for i in range(len(PUNCTUATION)))
_TO_STAND_INS = str.maketrans(PUNCTUATION, _STAND_INS)
_FROM_STAND_INS = str.maketrans(_STAND_INS, PUNCTUATION)
# What PostgreSQL highlights: this many characters before a text's first match and after it.
_WINDOW_BEFORE, _WINDOW_AFTER = 300, 2400
_RESERVED = re.compile("[\x00\ue000-\ue0ff]")

# What one run contributes, in characters: a tsvector holds at most 1 MB.
PROMPT_MAX, ANSWER_MAX, TOOLS_MAX = 20_000, 100_000, 20_000
QUERY_MAX = 200  # characters of `q`
TERMS_MAX = 32
PAGE_SIZE = 20
SNIPPET_TOKENS = 24  # FTS5 snippet length; ts_headline's MaxWords below
SNIPPET_CHARS = 400  # a snippet made of a few very long "words" is cut here
# Weights: prompt, answer, tool titles (PostgreSQL's A, B, C default to 1.0, 0.4, 0.2).
BM25_WEIGHTS = (5.0, 2.0, 1.0)
_HEADLINE_OPTIONS = (
    f'StartSel="{MARK_START}", StopSel="{MARK_END}", MaxWords={SNIPPET_TOKENS}, MinWords=8, '
    'MaxFragments=2, FragmentDelimiter=" … "'
)
# The events whose materialized state is indexed: text and tool cards (not reasoning).
_INDEXED_TYPES = (EventType.TOKEN_DELTA, EventType.TOOL_STARTED, EventType.TOOL_UPDATED, EventType.TOOL_DONE)
_WORD = re.compile(r"[^\W_]+")  # letters and digits: what both indexes call a word
_MARK_TAG = re.compile(r"(<mark>|</mark>)")


class QueryRefused(Refused, ValueError):
    """A query the API answers 422 to: `code` is machine-readable."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(422, code, message)


@dataclass(frozen=True)
class Hit:
    run_id: int
    session_id: int
    session_title: str
    project_id: int
    project_name: str
    snippet: str  # HTML: the text escaped, the matches in <mark>
    created_at: datetime
    rank: float


@dataclass(frozen=True)
class Results:
    hits: list[Hit]
    total: int
    terms: list[str]


# ---------------------------------------------------------------- indexing


def _clean(text: str, limit: int) -> str:
    return _RESERVED.sub("", text)[:limit]


def _indexed_events(run_id: int) -> Iterator[dict[str, Any]]:
    """The run's text and tool events as `materialize` takes them, read raw (no ORM per row)."""
    quote = connection.ops.quote_name
    placeholders = ", ".join(["%s"] * len(_INDEXED_TYPES))
    sql = (
        f"SELECT {quote('seq')}, {quote('type')}, {quote('payload')} FROM {quote('runs_journalevent')} "
        f"WHERE {quote('run_id')} = %s AND {quote('type')} IN ({placeholders}) ORDER BY {quote('seq')}"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [run_id, *[str(t) for t in _INDEXED_TYPES]])
        rows = cursor.fetchall()
    for seq, kind, payload in rows:
        if isinstance(payload, (str, bytes)):
            payload = orjson.loads(payload)
        yield {"seq": seq, "type": kind, "payload": payload, "terminal": False}


def document_fields(prompt: str, state: dict[str, Any]) -> dict[str, str]:
    """prompt, answer and tools of a run, from its prompt and its materialized state."""
    titles = []
    for item in state["items"]:
        title = item.get("title") if item["kind"] == "tool" else None
        if title is not None and str(title).strip():
            titles.append(" ".join(str(title).split()))
    return {
        "prompt": _clean(prompt, PROMPT_MAX),
        "answer": _clean(state["text"], ANSWER_MAX),
        "tools": _clean("\n".join(titles), TOOLS_MAX),
    }


def index_run(run_id: int) -> bool:
    """Write (or rewrite) a settled run's document. False: no such run, or it has not settled."""
    run = (
        Run.objects.filter(pk=run_id, status__in=TERMINAL_STATUSES)
        .values("prompt_text", "session_id", "session__project__owner_id", "created_at")
        .first()
    )
    if run is None:
        return False
    fields = document_fields(run["prompt_text"], materialize(_indexed_events(run_id)))
    document = SearchDocument(
        run_id=run_id,
        session_id=run["session_id"],
        owner_id=run["session__project__owner_id"],
        created_at=run["created_at"],
        indexed_at=timezone.now(),
        **fields,
    )
    with transaction.atomic():
        if connection.vendor == "postgresql":
            # The insert's foreign-key checks lock the run's row before the session's, against the
            # lock order (session, then run): a cancel racing the end of a run deadlocked with it
            # (bench/soak.py). Holding the session's key first, the insert waits behind its lock.
            with connection.cursor() as cursor:
                cursor.execute(
                    f"SELECT 1 FROM {Session._meta.db_table} WHERE id = %s FOR KEY SHARE", [run["session_id"]]
                )
        # One statement whoever else indexes the run at the same time (a reindex, a repeat).
        SearchDocument.objects.bulk_create(
            [document],
            update_conflicts=True,
            unique_fields=["run"],
            update_fields=["session", "owner", "prompt", "answer", "tools", "created_at", "indexed_at"],
        )
    return True


def _index_quietly(run_ids: Iterable[int]) -> None:
    # After the commit: a run must never fail because its search document could not be written.
    for run_id in run_ids:
        try:
            index_run(run_id)
        except Exception:
            log.exception("run %s: not indexed for search (`reindex_search --missing` adds it)", run_id)


def _index_session_quietly(session_id: int) -> None:
    settled = Run.objects.filter(session_id=session_id, status__in=TERMINAL_STATUSES)
    _index_quietly(list(settled.values_list("pk", flat=True)))


def index_on_commit(run_id: int) -> None:
    """Index a run once the transaction that settles it commits (at once outside one)."""
    transaction.on_commit(partial(_index_quietly, [run_id]), robust=True)


def index_session_on_commit(session_id: int) -> None:
    """Index every settled run of a session once the transaction commits (an import)."""
    transaction.on_commit(partial(_index_session_quietly, session_id), robust=True)


def missing_run_ids() -> list[int]:
    """Settled runs with no document: what a crash between a commit and its indexing leaves."""
    return list(
        Run.objects.filter(status__in=TERMINAL_STATUSES, search_document__isnull=True)
        .order_by("pk")
        .values_list("pk", flat=True)
    )


def settled_run_ids(after: int = 0, limit: int = 500) -> list[int]:
    return list(
        Run.objects.filter(status__in=TERMINAL_STATUSES, pk__gt=after)
        .order_by("pk")
        .values_list("pk", flat=True)[:limit]
    )


def rebuild_backend_index() -> None:
    """SQLite: rebuild the FTS5 index from the documents (repairs one out of step). PostgreSQL:
    nothing to do, its column is generated from the row."""
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO runs_searchdocument_fts(runs_searchdocument_fts) VALUES ('rebuild')")


def missing_triggers() -> list[str]:
    """SQLite: the FTS5 triggers a later table rebuild would have dropped (migration 0004)."""
    if connection.vendor != "sqlite":
        return []
    wanted = [f"runs_searchdocument_fts_{name}" for name in ("insert", "delete", "update")]
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")
        present = {row[0] for row in cursor.fetchall()}
    return [name for name in wanted if name not in present]


# ---------------------------------------------------------------- searching


def terms(q: str) -> list[str]:
    """The words of a query, in order, once each: FTS syntax (quotes, `*`, `-`, NEAR, OR) is
    only separators and words here. At most TERMS_MAX."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(q.casefold()):
        seen.setdefault(word, None)
    return list(seen)[:TERMS_MAX]


def check_query(q: str) -> str:
    stripped = q.strip()
    if not stripped:
        raise QueryRefused("query_empty", "Type something to search for.")
    if len(stripped) > QUERY_MAX:
        raise QueryRefused("query_too_long", f"A search is at most {QUERY_MAX} characters.")
    return stripped


def search(user: Any, q: str, *, page: int = 1, page_size: int = PAGE_SIZE) -> Results:
    """The user's settled runs that contain every word of `q`, best first, one page of them.

    Raises QueryRefused for an empty or too long query. A query with no words (`***`)
    finds nothing.
    """
    words = terms(check_query(q))
    if not words:
        return Results([], 0, [])
    backend = _Postgres() if connection.vendor == "postgresql" else _Sqlite()
    offset = (page - 1) * page_size
    total = backend.count(words, user.pk)
    ranked = backend.page(words, user.pk, page_size, offset) if offset < total else []
    if not ranked:
        return Results([], total, words)
    # Hydrated through the ORM (dates, quoting), with the ownership checked once more.
    texts = ("answer", "tools") if backend.HIGHLIGHTS_TEXT else ()
    rows = {
        row["pk"]: row
        for row in SearchDocument.objects.filter(
            pk__in=[doc_id for doc_id, _ in ranked], owner=user, session__project__owner=user
        ).values(
            "pk",
            "run_id",
            "session_id",
            "session__title",
            "session__project_id",
            "session__project__name",
            "created_at",
            "prompt",
            *texts,
        )
    }
    snippets = backend.snippets(words, rows)
    hits = []
    for doc_id, rank in ranked:
        row = rows.get(doc_id)
        if row is None:
            continue  # deleted, or no longer the user's, between the two reads
        raw = snippets.get(doc_id) or row["prompt"][:160]
        hits.append(
            Hit(
                run_id=row["run_id"],
                session_id=row["session_id"],
                session_title=row["session__title"],
                project_id=row["session__project_id"],
                project_name=row["session__project__name"],
                snippet=snippet_html(raw),
                created_at=row["created_at"],
                rank=float(rank),
            )
        )
    return Results(hits, total, words)


def snippet_html(raw: str) -> str:
    """A highlighter's output as HTML: every character of the text escaped, and the only
    markup `<mark>`…`</mark>` around matches, balanced."""
    text = " ".join(raw.translate(_FROM_STAND_INS).split())[:SNIPPET_CHARS]
    marked = html.escape(text, quote=True).replace(MARK_START, "<mark>").replace(MARK_END, "</mark>")
    out, open_ = [], False
    for part in _MARK_TAG.split(marked):
        if part == "<mark>":
            if not open_:
                out.append(part)
            open_ = True
        elif part == "</mark>":
            if open_:
                out.append(part)
            open_ = False
        else:
            out.append(part)
    if open_:
        out.append("</mark>")
    return "".join(out)


_OWNED = (
    "JOIN projects_session s ON s.id = d.session_id "
    "JOIN projects_project p ON p.id = s.project_id "
    "WHERE {match} AND d.owner_id = %s AND p.owner_id = %s"
)


class _Postgres:
    """A generated, weighted tsvector (`document`) with a GIN index; the words AND-ed."""

    MATCH = "d.document @@ plainto_tsquery('english', %s)"
    HIGHLIGHTS_TEXT = True  # ts_headline is given the text (a window of it), not a row

    def count(self, words: list[str], user_id: int) -> int:
        sql = "SELECT count(*) FROM runs_searchdocument d " + _OWNED.format(match=self.MATCH)
        with connection.cursor() as cursor:
            cursor.execute(sql, [" ".join(words), user_id, user_id])
            return int(cursor.fetchone()[0])

    def page(self, words: list[str], user_id: int, limit: int, offset: int) -> list[tuple[int, float]]:
        # Normalization 1: divided by 1 + log(length), so a long answer does not win by length alone.
        sql = (
            "SELECT d.id, ts_rank_cd(d.document, plainto_tsquery('english', %s), 1) AS rank "
            "FROM runs_searchdocument d "
            + _OWNED.format(match=self.MATCH)
            + " ORDER BY rank DESC, d.created_at DESC, d.id DESC LIMIT %s OFFSET %s"
        )
        query = " ".join(words)
        with connection.cursor() as cursor:
            cursor.execute(sql, [query, query, user_id, user_id, limit, offset])
            return [(int(doc_id), float(rank)) for doc_id, rank in cursor.fetchall()]

    def snippets(self, words: list[str], rows: dict[int, dict[str, Any]]) -> dict[int, str]:
        """ts_headline over a window of each text around its first match: it parses all it is
        given, and a 100,000-character answer costs ~30 ms where the window costs ~1."""
        query = " ".join(words)
        with connection.cursor() as cursor:
            cursor.execute("SELECT tsvector_to_array(to_tsvector('english', %s))", [query])
            stems = cursor.fetchone()[0] or []
            ids = list(rows)
            texts = [
                _window("\n".join((rows[i]["prompt"], rows[i]["answer"], rows[i]["tools"])), stems)
                for i in ids
            ]
            cursor.execute(
                "SELECT i, ts_headline('english', t, plainto_tsquery('english', %s), %s) "
                "FROM unnest(%s::text[]) WITH ORDINALITY AS u(t, i)",
                [query, _HEADLINE_OPTIONS, texts],
            )
            return {ids[int(i) - 1]: text for i, text in cursor.fetchall()}


def _window(text: str, stems: list[str]) -> str:
    """Around the first word that begins with one of the query's stems (or, failing that, a stem
    less its last letter: `happi` of happy), with the punctuation swapped for stand-ins."""
    start = 0
    for cut in (0, 1):
        prefixes = [stem[: len(stem) - cut] for stem in stems if len(stem) - cut >= 2]
        if prefixes:
            pattern = r"(?<![^\W_])(?:" + "|".join(map(re.escape, prefixes)) + ")"
            if found := re.search(pattern, text, re.IGNORECASE):
                start = found.start()
                break
    begin = max(0, start - _WINDOW_BEFORE)
    window = text[begin : start + _WINDOW_AFTER]
    if begin:
        window = re.sub(r"^\S{0,40}\s", "", window, count=1)  # from the start of a word
    return window.translate(_TO_STAND_INS)


class _Sqlite:
    """FTS5 over the documents (rowid = document id); each word a quoted string, AND-ed."""

    HIGHLIGHTS_TEXT = False  # snippet() reads the row itself

    MATCH = "runs_searchdocument_fts MATCH %s"
    FROM = "FROM runs_searchdocument_fts f CROSS JOIN runs_searchdocument d ON d.id = f.rowid "

    @staticmethod
    def expression(words: list[str]) -> str:
        # A word (\w+) holds no double quote: quoted, it is a plain string to FTS5, never syntax.
        return " ".join(f'"{word}"' for word in words)

    def count(self, words: list[str], user_id: int) -> int:
        sql = "SELECT count(*) " + self.FROM + _OWNED.format(match=self.MATCH)
        with connection.cursor() as cursor:
            cursor.execute(sql, [self.expression(words), user_id, user_id])
            return int(cursor.fetchone()[0])

    def page(self, words: list[str], user_id: int, limit: int, offset: int) -> list[tuple[int, float]]:
        weights = ", ".join(str(w) for w in BM25_WEIGHTS)
        # bm25 is lower for a better match: ascending, then the newest first.
        sql = (
            f"SELECT d.id, bm25(runs_searchdocument_fts, {weights}) AS rank "
            + self.FROM
            + _OWNED.format(match=self.MATCH)
            + " ORDER BY rank, d.created_at DESC, d.id DESC LIMIT %s OFFSET %s"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [self.expression(words), user_id, user_id, limit, offset])
            return [(int(doc_id), float(rank)) for doc_id, rank in cursor.fetchall()]

    def snippets(self, words: list[str], rows: dict[int, dict[str, Any]]) -> dict[int, str]:
        doc_ids = list(rows)
        placeholders = ", ".join(["%s"] * len(doc_ids))
        sql = (
            f"SELECT rowid, snippet(runs_searchdocument_fts, -1, %s, %s, '…', {SNIPPET_TOKENS}) "
            f"FROM runs_searchdocument_fts WHERE {self.MATCH} AND rowid IN ({placeholders})"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [MARK_START, MARK_END, self.expression(words), *doc_ids])
            return {int(doc_id): text for doc_id, text in cursor.fetchall()}
