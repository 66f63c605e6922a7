"""One rule merges text deltas into rows (runs/runner/coalesce.py): a turn written live by the run's
writer and the same turn imported from an agent's replay (runs/runner/jobs.py) follow it alike."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from runs.journal import NewEvent
from runs.models import JournalEvent
from runs.runner.coalesce import Coalescer, merged
from runs.runner.jobs import MERGE_LIMIT, ReplayedTurn, turn_body
from runs.runner.translate import Translator
from runs.runner.writer import MAX_COALESCED_CHARS, JournalWriter
from tests import factories


def delta(text: str, message_id: str = "m1") -> NewEvent:
    return NewEvent("token.delta", {"message_id": message_id, "delta": text})


def chunk(kind: str, text: str, message_id: str | None = None) -> dict[str, Any]:
    update: dict[str, Any] = {"sessionUpdate": kind, "content": {"type": "text", "text": text}}
    if message_id is not None:
        update["messageId"] = message_id
    return update


def said(text: str, message_id: str | None = None) -> dict[str, Any]:
    return chunk("agent_message_chunk", text, message_id)


def thought(text: str) -> dict[str, Any]:
    return chunk("agent_thought_chunk", text)


A_TURN = [
    thought("Let me "),
    thought("look."),
    said("It is ", "a1"),
    said("fixed", "a1"),
    said(".", "a1"),
    said("Also ", "a2"),
    said("this.", "a2"),
    thought("Then"),
    said("Done"),
    said(" now"),
    {"sessionUpdate": "plan", "entries": [{"content": "check", "status": "pending"}]},
    said("After the plan"),
]


def written_live(run: Any, updates: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    async def stream() -> None:
        writer = JournalWriter(run.pk, window_ms=60_000)
        translator = Translator()
        for update in updates:
            writer.add(translator.translate(update))
        writer.add(translator.finish())
        await writer.flush()

    asyncio.run(stream())
    return [(e.type, e.payload) for e in JournalEvent.objects.filter(run=run).order_by("seq")]


@pytest.mark.django_db(transaction=True)
def test_a_turn_written_live_and_the_same_turn_imported_merge_their_deltas_alike() -> None:
    live = written_live(factories.RunFactory(status="running"), A_TURN)
    imported = [(e.type, e.payload) for e in turn_body(ReplayedTurn(prompt="", updates=A_TURN))]

    assert live == imported
    assert [(t, p.get("delta")) for t, p in live] == [
        ("reasoning.delta", "Let me look."),
        ("reasoning.done", None),
        ("token.delta", "It is fixed."),
        ("token.delta", "Also this."),
        ("reasoning.delta", "Then"),
        ("reasoning.done", None),
        ("token.delta", "Done now"),
        ("plan.updated", None),
        ("token.delta", "After the plan"),
    ]


def test_a_delta_joins_the_one_before_it_of_its_segment_while_that_holds_less_than_the_limit() -> None:
    events = [delta("ab"), delta("cd"), delta("ef"), delta("g", "m2"), NewEvent("progress"), delta("h", "m2")]
    assert [e.payload.get("delta") for e in merged(events, limit=4)] == ["abcd", "ef", "g", None, "h"]
    assert [e.payload["delta"] for e in merged([delta("ab"), delta("cd")], limit=2)] == ["ab", "cd"]


def test_the_coalescer_holds_copies_and_says_when_an_event_is_not_a_delta() -> None:
    first = delta("a")
    coalescer = Coalescer(limit=100)
    assert coalescer.add([first, delta("b")]) is False
    assert coalescer.add([NewEvent("tool.started", {"tool_call_id": "t"})]) is True
    assert (coalescer.delta_chars, coalescer.has_deltas) == (2, True)
    assert [e.payload.get("delta") for e in coalescer.take()] == ["ab", None]
    assert first.payload["delta"] == "a" and not coalescer.events
    assert (coalescer.delta_chars, coalescer.has_deltas) == (0, False)


@pytest.mark.django_db(transaction=True)
def test_the_writer_cuts_a_long_segment_where_the_rule_does_at_its_limit() -> None:
    pieces = ["x" * 5000, "y" * 5000, "z" * 5000]
    live = written_live(factories.RunFactory(status="running"), [said(piece, "a1") for piece in pieces])
    expected = merged([delta(piece, "a1") for piece in pieces], MAX_COALESCED_CHARS)
    assert [len(p["delta"]) for _, p in live] == [len(e.payload["delta"]) for e in expected] == [10_000, 5000]
    # An import merges by the same rule into rows of up to MERGE_LIMIT: nobody watches a replay stream.
    assert [len(e.payload["delta"]) for e in merged(expected, MERGE_LIMIT)] == [15_000]
