"""runs/transcript.py: a run's journal folded into what the browser renders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runs import journal
from runs.journal import NewEvent
from runs.models import Run, RunStatus
from runs.transcript import apply_event, materialize
from tests.factories import RunFactory

pytestmark = pytest.mark.django_db

FIXTURES = Path(__file__).parent / "fixtures"


def fixture_events(name: str = "journal_tool_turn.json") -> list[NewEvent]:
    data = json.loads((FIXTURES / name).read_text())
    return [NewEvent(e["type"], e["payload"]) for e in data["events"]]


def fixture_run() -> Run:
    run = RunFactory(status=RunStatus.RUNNING)
    journal.append_batch(run.pk, fixture_events(), publish=False)
    run.refresh_from_db()
    return run


def test_it_materializes_a_fixture_journal_into_what_the_browser_renders() -> None:
    run = fixture_run()

    state = materialize(journal.read_after(run, 0))

    assert state["text"] == "I'll run the tests.All 3 tests pass."
    assert state["reasoning"] == "The user wants the tests run."
    assert [item["kind"] for item in state["items"]] == [
        "reasoning", "text", "plan", "tool", "approval", "steer", "plan", "text"
    ]  # fmt: skip
    reasoning, first_text = state["items"][0], state["items"][1]
    assert reasoning["done"] is True
    assert first_text == {"kind": "text", "message_id": "m1", "text": "I'll run the tests."}
    tool = state["tools"]["t1"]
    assert tool["status"] == "completed"
    assert tool["done"] is True
    assert tool["content"] == [{"type": "text", "text": "collected 3 items"}]
    assert state["plan"] == [{"content": "Run tests", "status": "completed"}]
    assert state["approvals"]["a1"]["resolved"] is True
    assert state["approvals"]["a1"]["choice"] == "allow"
    assert state["steers"] == [{"kind": "steer", "text": "also run ruff", "intent_id": 7}]
    assert state["title"] == "Run the tests"
    assert state["usage_final"] == {"input_tokens": 180, "output_tokens": 42}
    assert state["terminal"] is True
    assert state["terminal_state"] == "completed"
    assert state["stop_reason"] == "end_turn"
    assert state["last_seq"] == len(fixture_events())


def test_materializing_in_pages_equals_materializing_at_once() -> None:
    """A client that applies events page by page ends where a fresh load does (Zulip's verify_action)."""
    run = fixture_run()
    whole = materialize(journal.read_after(run, 0))

    state = materialize([])
    cursor = 0
    while page := journal.read_after(run, cursor, limit=4):
        for event in page:
            apply_event(state, event)
        cursor = page[-1].seq
    assert state == whole


def test_replayed_events_change_nothing() -> None:
    run = fixture_run()
    events = journal.read_after(run, 0)
    once = materialize(events)

    twice = materialize(events[:10] + events[5:] + events[-3:])
    assert twice == once


def test_it_materializes_envelopes_as_well_as_rows() -> None:
    run = fixture_run()
    events = journal.read_after(run, 0)

    from_rows = materialize(events)
    from_envelopes = materialize(journal.envelopes(events, run.session_id))
    assert from_envelopes == from_rows


def test_joined_stream_fold_equals_applying_each_event() -> None:
    """materialize joins a stream's consecutive deltas; the result is what one-by-one applying gives."""
    kinds = [
        ("token.delta", {"message_id": "m1"}),
        ("token.delta", {"message_id": "m1"}),
        ("reasoning.delta", {"reasoning_id": "r1"}),
        ("reasoning.delta", {"reasoning_id": "r1"}),
        ("reasoning.done", {}),
        ("reasoning.delta", {"reasoning_id": "r1"}),
        ("token.delta", {"message_id": "m1"}),
        ("token.delta", {"message_id": "m2"}),
        ("tool.started", {"tool_call_id": "t1", "title": "ls"}),
        ("token.delta", {"message_id": None}),
        ("token.delta", {"message_id": None}),
    ]
    events = [
        {"seq": seq, "type": kind, "terminal": False, "payload": {**extra, "delta": f"<{seq}>"}}
        for seq, (kind, extra) in enumerate(kinds, start=1)
    ]
    # A replay overlap: the same events again, and an older one inside a stream.
    replayed = events[:4] + events[1:3] + events[3:] + events[6:]

    one_by_one = materialize([])
    for event in replayed:
        apply_event(one_by_one, event)
    assert materialize(replayed) == one_by_one
    assert one_by_one["text"] == "<1><2><7><8><10><11>"
