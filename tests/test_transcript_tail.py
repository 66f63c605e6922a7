"""A finished turn larger than a transcript page comes from its end (issue 25, the long page).

Its page holds the run's last items within the page's budget and `items_from`, how many came
before them; GET /api/runs/{id}/items?before=k reads those back a bounded page at a time. Read
all the way back, the pages hold exactly the run's items: nothing lost and nothing twice.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from django.test import Client

from runs import transcript_pages as T
from runs.models import Run
from runs.transcript import materialize
from tests import factories

pytestmark = pytest.mark.django_db

KIB = 1024
PAGE = 16 * KIB


@pytest.fixture(autouse=True)
def small_pages(settings: Any) -> None:
    settings.HERMESWEB_TRANSCRIPT_PAGE_BYTES = PAGE
    T.fold_cache.clear()


def long_run(session: Any, *, tools: int = 60, status: str = "completed", tail: Any = ()) -> Run:
    """Text segments between tool cards, each segment ~1 KiB: about 8 pages' worth in all."""
    events: list[tuple[str, dict[str, Any]]] = []
    for n in range(tools):
        events.append(("token.delta", {"message_id": "m", "delta": f"part {n} " + "x" * KIB}))
        events.append(("tool.started", {"tool_call_id": f"t{n}", "title": f"tool {n}", "status": "pending"}))
        events.append(("tool.done", {"tool_call_id": f"t{n}", "status": "completed", "output": "ok"}))
    events.extend(tail)
    if status != "running":
        events.append(("done", {"state": status}))
    run = factories.run_with_events(events, session=session, status="running")
    Run.objects.filter(pk=run.pk).update(status=status)
    run.refresh_from_db()
    return run


def transcript(api: Client, session: Any) -> dict[str, Any]:
    response = api.get(f"/api/sessions/{session.pk}/transcript")
    assert response.status_code == 200, response.content
    return response.json()


def whole_items(run: Run) -> list[dict[str, Any]]:
    return materialize(run.events.order_by("seq"))["items"]


def test_a_finished_run_larger_than_the_page_comes_from_its_end(api: Client, session: Any) -> None:
    older = factories.run_with_events([("done", {"state": "completed"})], session=session)
    run = long_run(session)

    response = api.get(f"/api/sessions/{session.pk}/transcript")
    body = response.json()

    [turn] = body["turns"]
    items = whole_items(run)
    assert turn["run_id"] == run.pk and turn["complete"] is True
    assert 0 < turn["items_from"] < len(items)
    assert turn["state"]["items"] == items[turn["items_from"] :]
    assert turn["state"]["terminal"] is True and turn["state"]["last_seq"] == run.last_seq
    assert sum(len(orjson.dumps(item)) for item in turn["state"]["items"]) <= PAGE
    assert len(response.content) < 2 * PAGE
    # Older turns are a page of their own, as for any page a turn fills.
    assert body["has_more"] is True and body["before"] == run.pk
    assert older.pk != run.pk


def test_reading_back_gives_exactly_the_runs_items_a_bounded_page_at_a_time(
    api: Client, session: Any
) -> None:
    run = long_run(session)
    [turn] = transcript(api, session)["turns"]

    pages, before = [], turn["items_from"]
    while before:
        response = api.get(f"/api/runs/{run.pk}/items", {"before": before})
        assert response.status_code == 200, response.content
        page = response.json()
        assert page["run_id"] == run.pk and page["last_seq"] == run.last_seq
        assert 0 <= page["items_from"] < before
        assert sum(len(orjson.dumps(item)) for item in page["items"]) <= PAGE
        pages.insert(0, page["items"])
        before = page["items_from"]

    read = [item for page in pages for item in page] + turn["state"]["items"]
    assert len(pages) > 2 and read == whole_items(run)


def test_a_page_from_the_end_keeps_only_its_own_indexes_and_the_runs_last_error(session: Any) -> None:
    error = ("error", {"message": "the model stopped", "code": "model_error"})
    after = [("token.delta", {"message_id": f"z{n}", "delta": "y" * KIB}) for n in range(20)]
    run = long_run(session, status="failed", tail=[error, *after])

    [turn] = T.page_turns([run], PAGE).turns

    state = turn.state
    assert turn.items_from > 0 and state["terminal_state"] == "failed"
    assert set(state["tools"]) == {item["tool_call_id"] for item in state["items"] if item["kind"] == "tool"}
    assert (
        state["errors"][-1]["message"] == "the model stopped"
    )  # the banner's reason, though its item is earlier


def test_one_item_larger_than_the_page_comes_from_the_runs_start_instead(api: Client, session: Any) -> None:
    # Reading back a page at a time would stop at that item: the run is read on from its events.
    run = long_run(session, tail=[("token.delta", {"message_id": "big", "delta": "z" * 2 * PAGE})])

    [turn] = transcript(api, session)["turns"]

    assert turn["complete"] is False and turn["items_from"] == 0
    assert 0 < turn["state"]["last_seq"] < run.last_seq


def test_a_turn_from_its_end_is_too_large_for_a_rendered_fragment(
    client: Client, user: Any, session: Any
) -> None:
    run = long_run(session)
    client.force_login(user)

    body = client.get(f"/sessions/{session.pk}/fragment", {"runs": str(run.pk)}).content.decode()

    assert f'data-run="{run.pk}" data-too-large' in body


def test_reading_back_a_run_going_on_is_refused_with_a_code(api: Client, session: Any) -> None:
    run = long_run(session, status="running")

    response = api.get(f"/api/runs/{run.pk}/items", {"before": 5})

    assert response.status_code == 409 and response.json()["code"] == "run_not_finished"


@pytest.mark.parametrize("before", ["0", "-1", "x", ""])
def test_reading_back_from_a_bad_index_is_refused_with_a_code(api: Client, session: Any, before: str) -> None:
    run = long_run(session, tools=2)

    response = api.get(f"/api/runs/{run.pk}/items", {"before": before})

    assert response.status_code == 422 and response.json()["code"] == "validation_error"


def test_an_index_past_the_end_reads_the_runs_last_items(api: Client, session: Any) -> None:
    run = long_run(session, tools=2)

    page = api.get(f"/api/runs/{run.pk}/items", {"before": 10**6}).json()

    assert page["items"] == whole_items(run) and page["items_from"] == 0


def test_another_users_run_is_not_found_and_signing_in_is_required(
    api: Client, anonymous: Client, other_user: Any
) -> None:
    theirs = long_run(factories.SessionFactory(project=factories.ProjectFactory(owner=other_user)), tools=2)

    assert api.get(f"/api/runs/{theirs.pk}/items", {"before": 1}).status_code == 404
    assert anonymous.get(f"/api/runs/{theirs.pk}/items", {"before": 1}).status_code == 401


def test_the_opening_from_the_end_is_a_few_screens_and_reading_back_a_whole_page(
    api: Client, session: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(T, "TAIL_BYTES", 4 * KIB)
    run = long_run(session)

    [turn] = transcript(api, session)["turns"]
    page = api.get(f"/api/runs/{run.pk}/items", {"before": turn["items_from"]}).json()

    assert 0 < sum(len(orjson.dumps(item)) for item in turn["state"]["items"]) <= 4 * KIB
    assert 4 * KIB < sum(len(orjson.dumps(item)) for item in page["items"]) <= PAGE


def test_a_last_item_larger_than_the_opening_still_opens_at_the_end(
    api: Client, session: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(T, "TAIL_BYTES", 4 * KIB)
    run = long_run(session, tail=[("token.delta", {"message_id": "last", "delta": "w" * 8 * KIB})])

    [turn] = transcript(api, session)["turns"]

    assert turn["items_from"] == len(whole_items(run)) - 1
    assert turn["state"]["items"] == whole_items(run)[-1:]


def test_a_run_too_large_to_keep_comes_from_its_start_without_being_folded_whole(
    api: Client, session: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Folding it whole on every open would cost its whole size each time: it is read on instead.
    monkeypatch.setattr(T.fold_cache, "limit", 8 * KIB)
    run = long_run(session)
    folded_whole = []
    monkeypatch.setattr(T, "whole_fold", lambda run: folded_whole.append(run) or pytest.fail("folded whole"))

    [turn] = transcript(api, session)["turns"]

    assert turn["complete"] is False and turn["items_from"] == 0 and not folded_whole
    assert 0 < turn["state"]["last_seq"] < run.last_seq


def test_reading_back_a_run_too_large_to_keep_is_refused_with_a_code(
    api: Client, session: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each page would fold all of it again: such a run's page never comes from its end anyway.
    monkeypatch.setattr(T.fold_cache, "limit", 8 * KIB)
    run = long_run(session)
    monkeypatch.setattr(T, "whole_fold", lambda run: pytest.fail("folded whole"))

    response = api.get(f"/api/runs/{run.pk}/items", {"before": 5})

    assert response.status_code == 409 and response.json()["code"] == "run_too_large"
