"""The journal writer coalesces deltas and keeps arrival order."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from runs.journal import NewEvent
from runs.models import JournalEvent
from runs.writer import JournalWriter
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


def delta(text: str, message_id: str = "m1") -> NewEvent:
    return NewEvent("token.delta", {"message_id": message_id, "delta": text})


def rows(run: Any) -> list[tuple[str, dict]]:
    return [(e.type, e.payload) for e in JournalEvent.objects.filter(run=run).order_by("seq")]


def test_deltas_within_the_window_become_one_row() -> None:
    run = factories.RunFactory(status="running")

    async def scenario() -> None:
        writer = JournalWriter(run.pk, window_ms=10_000)
        for word in ("a", "b", "c"):
            writer.add([delta(word)])
        await writer.flush()

    asyncio.run(scenario())
    assert rows(run) == [("token.delta", {"message_id": "m1", "delta": "abc"})]


def test_a_non_delta_event_flushes_in_order_and_splits_segments() -> None:
    run = factories.RunFactory(status="running")

    async def scenario() -> None:
        writer = JournalWriter(run.pk, window_ms=10_000)
        writer.add([delta("before ")])
        writer.add([NewEvent("tool.started", {"tool_call_id": "t"})])
        writer.add([delta("after", "m2")])
        await writer.flush()

    asyncio.run(scenario())
    assert [t for t, _ in rows(run)] == ["token.delta", "tool.started", "token.delta"]


def test_different_messages_are_not_merged() -> None:
    run = factories.RunFactory(status="running")

    async def scenario() -> None:
        writer = JournalWriter(run.pk, window_ms=10_000)
        writer.add([delta("one", "m1"), delta("two", "m2")])
        await writer.flush()

    asyncio.run(scenario())
    assert [p["delta"] for _, p in rows(run)] == ["one", "two"]


def test_the_window_flushes_without_a_further_event() -> None:
    run = factories.RunFactory(status="running")

    async def scenario() -> None:
        writer = JournalWriter(run.pk, window_ms=5)
        writer.add([delta("x")])
        for _ in range(200):
            if await asyncio.to_thread(JournalEvent.objects.filter(run=run).exists):
                return
            await asyncio.sleep(0.01)

    asyncio.run(scenario())
    assert rows(run) == [("token.delta", {"message_id": "m1", "delta": "x"})]


def test_finish_writes_the_terminal_event_last() -> None:
    run = factories.RunFactory(status="running")

    async def scenario() -> None:
        writer = JournalWriter(run.pk, window_ms=10_000)
        writer.add([delta("partial")])
        await writer.finish([NewEvent("done", {"state": "completed"})])

    asyncio.run(scenario())
    run.refresh_from_db()
    assert [t for t, _ in rows(run)] == ["token.delta", "done"]
    assert run.status == "completed" and run.finished_at is not None
