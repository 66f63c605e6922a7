"""A finished run's page fold is kept (runs/transcript.py, `fold_cache`; issue 25, the long page).

The fast path must answer what the rule does: the cached state of a finished run equals a fresh
fold of its journal (`fold_within`), a page from its end is cut from it, and anything that moves
the fold (a later event, compaction) is folded afresh.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from runs import journal
from runs import transcript_pages as T
from runs.management.commands.compact_journal import compact_run
from runs.models import Run
from runs.transcript import materialize
from tests import factories

pytestmark = pytest.mark.django_db

DELTAS = 60


@pytest.fixture(autouse=True)
def small_runs_are_kept(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Runs of a few dozen events stand for long ones: the size floor is the only difference.
    monkeypatch.setattr(T, "SIZE_CHECK_EVENTS", 10)
    T.fold_cache.clear()
    yield
    T.fold_cache.clear()


@pytest.fixture
def session(user: Any) -> Any:
    return factories.SessionFactory(project=factories.ProjectFactory(owner=user))


def events() -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    for i in range(DELTAS):
        out.append(("token.delta", {"message_id": f"m{i // 20}", "delta": f"word {i}, "}))
        if i % 7 == 6:
            out.append(("tool.updated", {"tool_call_id": f"t{i // 14}", "status": "in_progress"}))
    return out


def finished(session: Any) -> Run:
    run = factories.run_with_events(
        [*events(), ("done", {"state": "completed"})], session=session, status="running"
    )
    Run.objects.filter(pk=run.pk).update(status="completed")
    run.refresh_from_db()
    return run


def page(run: Run, budget: int) -> T.PagedTurn:
    [turn] = T.page_turns([Run.objects.get(pk=run.pk)], budget).turns
    return turn


def test_a_finished_runs_kept_fold_equals_a_fresh_fold(session: Any) -> None:
    run = finished(session)

    first, again = page(run, 10**9), page(run, 10**9)

    fresh_state, _, fresh_complete = T.fold_within(Run.objects.get(pk=run.pk), None)
    assert again.state is first.state  # the second page read the kept fold
    assert again.state == fresh_state and again.complete and fresh_complete


def test_a_page_from_the_runs_end_is_cut_from_the_kept_fold(session: Any) -> None:
    run = finished(session)
    whole = page(run, 10**9)

    tail = page(run, 400)

    assert tail.complete and tail.items_from > 0
    assert tail.state["items"] == whole.state["items"][tail.items_from :]
    assert len(T.fold_cache.entries) == 1  # one fold serves every budget


def test_the_transcript_api_answers_the_fresh_fold_from_the_kept_one(api: Client, session: Any) -> None:
    run = finished(session)
    api.get(f"/api/sessions/{session.pk}/transcript")

    [turn] = api.get(f"/api/sessions/{session.pk}/transcript").json()["turns"]

    fresh = materialize(run.events.order_by("seq"))
    assert turn["complete"] is True
    assert turn["state"] == T.page_state(fresh)
    assert len(T.fold_cache.entries) == 1


def test_a_run_going_on_is_folded_afresh_each_time(session: Any) -> None:
    run = factories.run_with_events(events(), session=session, status="running")
    page(run, 10**9)
    journal.append_batch(
        run.pk, [journal.NewEvent("token.delta", {"message_id": "m9", "delta": "more"})], publish=False
    )

    state = page(run, 10**9).state

    assert not T.fold_cache.entries
    assert state["items"][-1]["text"].endswith("more")


def test_compaction_folds_the_run_afresh(session: Any) -> None:
    # A terminal run takes no more events (runs.journal refuses them): its rows change only by
    # compaction, which moves `compacted_through`.
    run = finished(session)
    before = page(run, 10**9)

    compact_run(Run.objects.get(pk=run.pk))
    compacted = Run.objects.get(pk=run.pk)
    after = page(compacted, 10**9)

    assert after.state is not before.state and len(T.fold_cache.entries) == 2
    assert after.state == T.fold_within(compacted, None)[0] == materialize(compacted.events.order_by("seq"))


def test_the_kept_folds_stay_within_their_byte_limit() -> None:
    cache = T.FoldCache(limit=100)
    for key in range(5):
        cache.put((key,), T.WholeFold({"items": []}, 40, []))

    assert list(cache.entries) == [(3,), (4,)]
    assert cache.spent == 80
    cache.put((9,), T.WholeFold({"items": []}, 101, []))  # larger than the whole cache: not kept
    assert (9,) not in cache.entries


def test_a_fold_reads_the_same_without_server_side_cursors(
    session: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As behind a transaction pooler (DISABLE_SERVER_SIDE_CURSORS): the rows come whole, same fold.
    from django.db import connection

    run = finished(session)
    streamed = T.fold_within(run, budget=None)
    monkeypatch.setitem(connection.settings_dict, "DISABLE_SERVER_SIDE_CURSORS", True)

    assert T.fold_within(run, budget=None) == streamed
    assert streamed[0] == materialize(run.events.order_by("seq"))
