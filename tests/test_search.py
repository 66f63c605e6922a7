"""Search across a user's sessions (docs/search.md): the index kept as runs settle, the API.

Runs on both databases: FTS5 on SQLite, tsvector + GIN on PostgreSQL. Runs settle through
`turns.finish_run` (every way a run ends) and imports through `discovery.write_import`.
"""

from __future__ import annotations

import html
import io
import re
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client

from runs import journal, search
from runs.discovery import ImportedHistory, ImportedTurn, write_import
from runs.journal import NewEvent, done_event
from runs.models import Run, RunStatus, SearchDocument
from runs.turns import finish_run
from tests import factories
from tests.support.pglocks import another_backend_waits_on_a_lock

pytestmark = pytest.mark.django_db

Capture = Callable[..., Any]  # pytest-django's django_capture_on_commit_callbacks


def start_run(session: Any, prompt: str, text: str = "", tools: tuple[str, ...] = ()) -> Run:
    """A running turn whose journal holds `text` and tool calls titled `tools` (no terminal yet)."""
    run = factories.RunFactory(session=session, prompt_text=prompt, status=RunStatus.RUNNING)
    events = [NewEvent("run.started", {"status": "running"})]
    for index, title in enumerate(tools):
        events.append(
            NewEvent("tool.started", {"tool_call_id": f"t{index}", "title": title, "status": "pending"})
        )
        events.append(NewEvent("tool.done", {"tool_call_id": f"t{index}", "status": "completed"}))
    if text:
        # Two deltas: the document holds the materialized text, not one event's.
        half = len(text) // 2
        events.append(NewEvent("token.delta", {"message_id": "m1", "delta": text[:half]}))
        events.append(NewEvent("token.delta", {"message_id": "m1", "delta": text[half:]}))
    journal.append_batch(run.pk, events, publish=False)
    return run


def settle(run: Run, state: str = RunStatus.COMPLETED) -> None:
    finish_run(run.pk, [done_event(state)])


def settled_run(
    capture: Capture, session: Any, prompt: str, text: str = "", tools: tuple[str, ...] = ()
) -> Run:
    run = start_run(session, prompt, text, tools)
    with capture(execute=True):
        settle(run)
    return run


def find(client: Client, q: str, **params: Any) -> dict[str, Any]:
    response = client.get("/api/search", {"q": q, **params})
    assert response.status_code == 200, response.content
    return response.json()


def run_ids(body: dict[str, Any]) -> list[int]:
    return [hit["run_id"] for hit in body["hits"]]


# ---------------------------------------------------------------- kept current as runs settle


def test_a_run_is_indexed_when_it_settles_and_not_before(
    api: Client, session: Any, django_capture_on_commit_callbacks: Capture
) -> None:
    run = start_run(session, "Refactor the parser", "I split the tokenizer out.", ("Read parser.py",))
    assert find(api, "tokenizer")["hits"] == []
    assert not SearchDocument.objects.filter(run=run).exists()

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        settle(run)
        # Written after the commit, not inside the transaction that recorded `done`.
        assert not SearchDocument.objects.filter(run=run).exists()
    assert callbacks
    document = SearchDocument.objects.get(run=run)
    assert (document.prompt, document.answer, document.tools) == (
        "Refactor the parser",
        "I split the tokenizer out.",
        "Read parser.py",
    )
    assert (document.session_id, document.owner_id) == (session.pk, session.project.owner_id)

    for q in ("refactor", "tokenizer", "parser.py"):
        body = find(api, q)
        assert run_ids(body) == [run.pk], q
        hit = body["hits"][0]
        assert (hit["session_id"], hit["session_title"], hit["project_id"]) == (
            session.pk,
            session.title,
            session.project_id,
        )
        assert hit["created_at"]
        assert "<mark>" in hit["snippet"]


@pytest.mark.parametrize("state", [RunStatus.CANCELLED, RunStatus.FAILED])
def test_every_terminal_state_is_indexed(
    api: Client, session: Any, django_capture_on_commit_callbacks: Capture, state: str
) -> None:
    run = start_run(session, "halfway there", "partial answer")
    with django_capture_on_commit_callbacks(execute=True):
        settle(run, state)
    assert run_ids(find(api, "partial")) == [run.pk]


def test_an_interrupted_run_is_indexed(
    api: Client, session: Any, django_capture_on_commit_callbacks: Capture
) -> None:
    from runs.turns import do_mark_interrupted

    run = start_run(session, "long migration", "started copying")
    with django_capture_on_commit_callbacks(execute=True):
        assert do_mark_interrupted(run, "runner lost")
    assert run_ids(find(api, "copying")) == [run.pk]


@pytest.mark.django_db(transaction=True)
def test_a_committed_finish_indexes_for_real(api: Client, session: Any) -> None:
    """No captured callbacks: finish_run's own transaction commits, then the document is written."""
    run = start_run(session, "deploy the staging cluster", "Rolled out.")
    assert find(api, "staging")["hits"] == []
    settle(run)
    assert run_ids(find(api, "staging")) == [run.pk]


def test_an_import_is_indexed(api: Client, project: Any, django_capture_on_commit_callbacks: Capture) -> None:
    history = ImportedHistory(
        turns=[
            ImportedTurn(
                "why is the cache cold", [NewEvent("token.delta", {"message_id": "a", "delta": "warmup"})]
            ),
            ImportedTurn(
                "second question",
                [
                    NewEvent(
                        "tool.started", {"tool_call_id": "x", "title": "Grep memoize", "status": "pending"}
                    )
                ],
            ),
        ],
        title="Imported chat",
    )
    with django_capture_on_commit_callbacks(execute=True):
        session, created = write_import(project.pk, "agent-1", history, "demo")
    assert created
    turns = list(Run.objects.filter(session=session).order_by("pk").values_list("pk", flat=True))
    assert run_ids(find(api, "warmup")) == [turns[0]]
    assert run_ids(find(api, "memoize")) == [turns[1]]
    assert find(api, "cache")["hits"][0]["session_title"] == "Imported chat"


def test_a_failure_to_index_never_fails_the_run(
    session: Any, django_capture_on_commit_callbacks: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(run_id: int) -> bool:
        raise RuntimeError("index down")

    monkeypatch.setattr(search, "index_run", broken)
    run = start_run(session, "resilient", "still done")
    with django_capture_on_commit_callbacks(execute=True):
        settle(run)
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert not SearchDocument.objects.filter(run=run).exists()
    assert search.missing_run_ids() == [run.pk]


def test_reindex_search_rebuilds_and_fills_what_is_missing(api: Client, session: Any) -> None:
    """Runs settled before search existed (here: written straight into the journal) are found after it."""
    old = factories.run_with_events(
        [
            ("run.started", {}),
            ("token.delta", {"message_id": "m", "delta": "legacy gizmo"}),
            ("done", {"state": "completed"}),
        ],
        session=session,
        status=RunStatus.RUNNING,
        prompt_text="from before",
    )
    active = start_run(session, "gizmo still running")
    assert find(api, "gizmo")["total"] == 0
    out = io.StringIO()
    call_command("reindex_search", "--missing", stdout=out)
    assert "indexed 1 run(s)" in out.getvalue()
    assert run_ids(find(api, "gizmo")) == [old.pk]  # the active run waits for its end

    SearchDocument.objects.filter(run=old).update(answer="stale")
    call_command("reindex_search", stdout=io.StringIO())
    assert SearchDocument.objects.get(run=old).answer == "legacy gizmo"
    assert run_ids(find(api, "gizmo")) == [old.pk]
    assert not SearchDocument.objects.filter(run=active).exists()


@pytest.mark.sqlite
def test_reindex_search_refuses_without_the_triggers() -> None:
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER runs_searchdocument_fts_update")
    with pytest.raises(CommandError, match="runs_searchdocument_fts_update"):
        call_command("reindex_search", stdout=io.StringIO())


def test_a_deleted_session_leaves_nothing_behind(
    api: Client, session: Any, django_capture_on_commit_callbacks: Capture
) -> None:
    settled_run(django_capture_on_commit_callbacks, session, "ephemeral words")
    assert find(api, "ephemeral")["total"] == 1
    assert api.delete(f"/api/sessions/{session.pk}").status_code == 204
    assert find(api, "ephemeral")["total"] == 0
    assert not SearchDocument.objects.exists()
    if connection.vendor == "sqlite":
        # The FTS5 index followed the row out (its trigger), and is consistent.
        with connection.cursor() as cursor:
            fts = "runs_searchdocument_fts"
            cursor.execute(f"INSERT INTO {fts}({fts}, rank) VALUES ('integrity-check', 1)")


# ---------------------------------------------------------------- the API


def test_owner_scoping(
    api: Client, session: Any, other_user: Any, staff_user: Any, django_capture_on_commit_callbacks: Capture
) -> None:
    mine = settled_run(django_capture_on_commit_callbacks, session, "shared secretword mine")
    theirs_session = factories.SessionFactory(project=factories.ProjectFactory(owner=other_user))
    theirs = settled_run(django_capture_on_commit_callbacks, theirs_session, "shared secretword theirs")

    assert run_ids(find(api, "secretword")) == [mine.pk]
    other = Client()
    other.force_login(other_user)
    assert run_ids(find(other, "secretword")) == [theirs.pk]
    # Staff search their own sessions only, like every API route.
    staff = Client()
    staff.force_login(staff_user)
    assert find(staff, "secretword")["total"] == 0
    # A token is the same user.
    assert run_ids(find(factories_token(other_user), "secretword")) == [theirs.pk]
    assert Client().get("/api/search", {"q": "secretword"}).status_code == 401


def test_a_project_given_away_takes_its_hits_along(
    api: Client, session: Any, other_user: Any, django_capture_on_commit_callbacks: Capture
) -> None:
    """The document's owner is checked against the project's owner now, not only when it was written."""
    settled_run(django_capture_on_commit_callbacks, session, "handover notes")
    project = session.project
    project.owner = other_user
    project.save(update_fields=["owner"])
    assert find(api, "handover")["total"] == 0


def factories_token(user: Any) -> Client:
    from tests.conftest import token_client

    return token_client(user)


@pytest.mark.parametrize(
    "q",
    [
        '"',
        '"unbalanced',
        "*",
        "alpha*",
        "-alpha",
        "alpha -beta",
        "NEAR(alpha beta)",
        "alpha NEAR beta",
        "alpha OR beta",
        "alpha AND NOT beta",
        "prompt:alpha",
        "{prompt answer}: alpha",
        "^alpha",
        "alpha + beta",
        "(alpha",
        "'; DROP TABLE runs_run; --",
        "alpha\x00beta",
        "%_\\",
        "ünïcode alpha",
        "\ue000alpha\ue001",
    ],
)
def test_query_syntax_is_only_words(
    api: Client, session: Any, django_capture_on_commit_callbacks: Capture, q: str
) -> None:
    # Every word a query below might leave standing, so each either finds the run or names a
    # word it lacks (or none): the same on both databases.
    prompt = "alpha beta near prompt not and or ünïcode"
    run = settled_run(django_capture_on_commit_callbacks, session, prompt)
    response = api.get("/api/search", {"q": q})
    assert response.status_code == 200, response.content
    body = response.json()
    expected = search.terms(q)
    assert body["terms"] == expected
    found = bool(expected) and set(expected) <= set(prompt.split())
    assert run_ids(body) == ([run.pk] if found else []), q
    assert Run.objects.filter(pk=run.pk).exists()


def test_words_of_a_query_are_all_required(
    api: Client, session: Any, django_capture_on_commit_callbacks: Capture
) -> None:
    both = settled_run(django_capture_on_commit_callbacks, session, "kettle whistle")
    settled_run(django_capture_on_commit_callbacks, session, "kettle only")
    assert run_ids(find(api, "kettle whistle")) == [both.pk]
    assert run_ids(find(api, '"whistle" -kettle')) == [both.pk]  # `-` is not NOT here
    assert find(api, "***")["total"] == 0


@pytest.mark.parametrize(
    ("q", "code"),
    [("", "query_empty"), ("   ", "query_empty"), ("x" * (search.QUERY_MAX + 1), "query_too_long")],
)
def test_an_empty_or_too_long_query_is_a_422_with_a_code(api: Client, q: str, code: str) -> None:
    response = api.get("/api/search", {"q": q})
    assert response.status_code == 422
    assert response.json()["code"] == code


def test_missing_q_and_bad_pages(api: Client) -> None:
    response = api.get("/api/search")
    assert (response.status_code, response.json()["code"]) == (422, "query_empty")
    for params in ({"page": 0}, {"page": "x"}, {"page_size": 51}, {"page": 10**6}):
        response = api.get("/api/search", {"q": "word", **params})
        assert (response.status_code, response.json()["code"]) == (422, "validation_error"), params


def test_pagination(api: Client, session: Any, django_capture_on_commit_callbacks: Capture) -> None:
    runs = [settled_run(django_capture_on_commit_callbacks, session, f"pager item {n}") for n in range(7)]
    first = find(api, "pager", page_size=3)
    assert (first["total"], first["page"], first["page_size"], first["has_next"]) == (7, 1, 3, True)
    second = find(api, "pager", page=2, page_size=3)
    third = find(api, "pager", page=3, page_size=3)
    assert (len(second["hits"]), len(third["hits"]), third["has_next"]) == (3, 1, False)
    seen = run_ids(first) + run_ids(second) + run_ids(third)
    assert sorted(seen) == sorted(r.pk for r in runs)  # every hit once, none twice
    # Equal relevance: the newest first.
    assert seen == sorted(seen, reverse=True)
    beyond = find(api, "pager", page=9, page_size=3)
    assert (beyond["hits"], beyond["total"], beyond["has_next"]) == ([], 7, False)
    assert len(find(api, "pager")["hits"]) == 7  # the default page holds 20


def test_ranking_prefers_the_prompt_and_more_matches(
    api: Client, session: Any, django_capture_on_commit_callbacks: Capture
) -> None:
    in_tools = settled_run(django_capture_on_commit_callbacks, session, "one", "nothing", ("Run zebra",))
    in_answer = settled_run(django_capture_on_commit_callbacks, session, "two", "a zebra appeared")
    in_prompt = settled_run(django_capture_on_commit_callbacks, session, "zebra crossing")
    # Oldest first would be in_tools, in_answer, in_prompt: the order is relevance, not age.
    assert run_ids(find(api, "zebra")) == [in_prompt.pk, in_answer.pk, in_tools.pk]


def test_stemming_finds_other_forms_of_a_word(
    api: Client, session: Any, django_capture_on_commit_callbacks: Capture
) -> None:
    run = settled_run(django_capture_on_commit_callbacks, session, "the tests are failing")
    assert run_ids(find(api, "test fail")) == [run.pk]


def test_the_snippet_is_escaped_text_with_only_marks(
    api: Client, session: Any, django_capture_on_commit_callbacks: Capture
) -> None:
    hostile = 'Use <Button onClick="x">needle</Button> & <script>alert("needle")</script> &amp; done'
    settled_run(
        django_capture_on_commit_callbacks,
        session,
        "prompt with \ue000forged\ue001 marks",
        hostile,
        ('<img src=x onerror="alert(1)"> needle',),
    )
    body = find(api, "needle")
    snippet = body["hits"][0]["snippet"]
    tags = re.findall(r"<[^>]*>", snippet)
    assert tags and set(tags) <= {"<mark>", "</mark>"}, snippet
    assert snippet.count("<mark>") == snippet.count("</mark>") >= 1
    # Unescaped and unmarked, it is the stored text: nothing was dropped, `<Button>` included.
    text = html.unescape(snippet.replace("<mark>", "").replace("</mark>", ""))
    assert '<Button onClick="x">needle</Button>' in text
    assert "&amp;" in text
    assert re.search(r"<mark>needle</mark>", snippet)
    # The private-use characters the highlighter marks with are never in the text.
    forged = find(api, "forged")["hits"][0]["snippet"]
    assert "\ue000" not in forged and forged.count("<mark>") == 1


def test_snippet_html_balances_and_escapes() -> None:
    m, e = search.MARK_START, search.MARK_END
    assert search.snippet_html(f"a {m}<b>{e} {e}c {m}d") == "a <mark>&lt;b&gt;</mark> c <mark>d</mark>"
    assert search.snippet_html(f"{m}{m}x{e}") == "<mark>x</mark>"
    assert search.snippet_html("line one\n\nline   two") == "line one line two"


def test_a_match_deep_in_a_long_answer_is_highlighted(
    api: Client, session: Any, django_capture_on_commit_callbacks: Capture
) -> None:
    filler = "plain words of no interest. " * 2500  # ~70,000 characters
    settled_run(
        django_capture_on_commit_callbacks,
        session,
        "long one",
        filler + "The marmot is happy." + filler,
    )
    for q in ("marmot", "happiness"):  # `happi`, the stem of both, is no prefix of happy
        snippet = find(api, q)["hits"][0]["snippet"]
        assert re.search(r"<mark>(marmot|happy)</mark>", snippet), (q, snippet)
        assert len(snippet) < 2 * search.SNIPPET_CHARS


def test_a_huge_answer_is_indexed_up_to_its_limit(
    api: Client, session: Any, django_capture_on_commit_callbacks: Capture
) -> None:
    words = " ".join(f"w{n}" for n in range(40_000))  # ~250k characters
    run = settled_run(django_capture_on_commit_callbacks, session, "huge", "early " + words + " late")
    document = SearchDocument.objects.get(run=run)
    assert len(document.answer) == search.ANSWER_MAX
    assert run_ids(find(api, "early")) == [run.pk]
    assert find(api, "late")["total"] == 0


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_indexing_a_run_waits_for_its_session_lock_without_holding_the_run_against_it(session: Any) -> None:
    """bench/soak.py found it: the document's insert locked the run (a foreign-key check) and then
    waited for the session, while a cancel held the session and waited for the run: a deadlock."""
    import threading

    from django.db import OperationalError, connections, transaction

    from projects.models import Session

    run = start_run(session, "cancel racing the end", "the end")
    settle(run)
    SearchDocument.objects.filter(run=run).delete()  # the first insert is the one that raced
    failures: list[BaseException] = []

    def index() -> None:
        try:
            search.index_run(run.pk)
        except BaseException as exc:  # shown by the assertion below
            failures.append(exc)
        finally:
            connections.close_all()

    with transaction.atomic():
        Session.objects.lock(session.pk)  # as do_cancel, finish_run and every intent action do
        indexer = threading.Thread(target=index)
        indexer.start()

        from tests.support.procs import wait_for

        wait_for(another_backend_waits_on_a_lock, 10, what="the indexer to wait for the session's lock")
        try:
            # do_cancel's next step: the run, under the session's lock. Before the fix the
            # indexer held the run's key here, and this waited on it (a deadlock).
            Run.objects.select_for_update(nowait=True).get(pk=run.pk)
        except OperationalError as exc:
            raise AssertionError(f"the indexer holds the run while it waits for the session: {exc}") from exc
    indexer.join(10)
    assert not failures and SearchDocument.objects.filter(run=run).exists()
