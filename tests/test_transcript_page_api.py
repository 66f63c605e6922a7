"""The transcript API's page carries each character of a turn once (issue 25, the long page).

A turn's state is `materialize()`'s without `text` and `reasoning`: those are its text and
reasoning items joined, so sending both made a page of 4 MiB of payloads nearly twice that.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from runs.transcript import materialize
from runs.transcript_pages import PAGE_OMITS
from tests import factories

pytestmark = pytest.mark.django_db

KIB = 1024


@pytest.fixture
def session(user: Any) -> Any:
    return factories.SessionFactory(project=factories.ProjectFactory(owner=user))


def finished(session: Any, events: list[tuple[str, dict[str, Any]]]) -> Any:
    run = factories.run_with_events(
        [*events, ("done", {"state": "completed"})], session=session, status="running"
    )
    run.status = "completed"
    run.save(update_fields=["status"])
    return run


def joined(state: dict[str, Any], kind: str) -> str:
    return "".join(item["text"] for item in state["items"] if item["kind"] == kind)


def test_a_pages_state_is_the_fold_without_its_joined_text_and_reasoning(api: Client, session: Any) -> None:
    run = finished(
        session,
        [
            ("reasoning.delta", {"reasoning_id": "r1", "delta": "Think "}),
            ("reasoning.delta", {"reasoning_id": "r1", "delta": "first."}),
            ("reasoning.done", {"reasoning_id": "r1"}),
            ("token.delta", {"message_id": "m1", "delta": "Reading "}),
            ("tool.started", {"tool_call_id": "t1", "title": "cat a.py", "status": "in_progress"}),
            ("token.delta", {"message_id": "m1", "delta": "it now."}),
            ("token.delta", {"message_id": "m2", "delta": " Done."}),
        ],
    )
    whole = materialize(run.events.order_by("seq"))

    [turn] = api.get(f"/api/sessions/{session.pk}/transcript").json()["turns"]

    state = turn["state"]
    assert "text" not in state and "reasoning" not in state
    assert joined(state, "text") == whole["text"] == "Reading it now. Done."
    assert joined(state, "reasoning") == whole["reasoning"] == "Think first."
    assert state == {key: value for key, value in whole.items() if key not in PAGE_OMITS}


def test_a_cut_turns_page_is_about_its_byte_budget_not_twice_it(
    api: Client, session: Any, settings: Any
) -> None:
    settings.HERMESWEB_TRANSCRIPT_PAGE_BYTES = 64 * KIB
    run = finished(session, [("token.delta", {"message_id": "m", "delta": "z" * 8 * KIB})] * 64)

    response = api.get(f"/api/sessions/{session.pk}/transcript")

    [turn] = response.json()["turns"]
    assert turn["complete"] is False and 0 < turn["state"]["last_seq"] < run.last_seq
    assert len(joined(turn["state"], "text")) > 48 * KIB  # most of the budget is the turn's text…
    assert len(response.content) < 1.25 * 64 * KIB  # …and it is sent once
