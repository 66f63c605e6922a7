"""A run's notifications leave in journal order, after their commits, each once, while the next
batch commits (runs/runner/writer.py, the loop's Publisher)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from runs import journal, notify, turns
from runs.journal import NewEvent
from runs.models import RunStatus
from runs.runner.writer import JournalWriter, group_commit
from tests import factories
from tests.support.pgproxy import PgProxy
from tests.test_writer import delta, rows, writer_on_the_loop
from tests.test_writer_exactly_once import proxy  # noqa: F401  # the fixture

pytestmark = pytest.mark.django_db(transaction=True)


class Doorbell:
    """Records every journal notification (run id, its seqs) as it is sent; can hold the first one."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, hold_first: bool = False) -> None:
        self.sent: list[tuple[int, list[int]]] = []
        self.held = asyncio.Event()  # the first publish has started and waits for `release`
        self.release = asyncio.Event()
        if not hold_first:
            self.release.set()
        monkeypatch.setattr(notify, "apublish_many", self.apublish_many)
        monkeypatch.setattr(notify, "apublish_events", self.apublish_events)
        monkeypatch.setattr(notify, "publish_events", self.record)  # synchronous code's, on commit

    def record(self, session_id: int, run_id: int, envelopes: list[dict[str, Any]]) -> None:
        self.sent.append((run_id, [envelope["seq"] for envelope in envelopes]))

    async def apublish_events(self, session_id: int, run_id: int, envelopes: list[dict[str, Any]]) -> None:
        self.record(session_id, run_id, envelopes)
        self.held.set()
        await self.release.wait()

    async def apublish_many(self, batches: list[tuple[int, int, list[dict[str, Any]]]]) -> None:
        for batch in batches:
            self.record(*batch)
        self.held.set()
        await self.release.wait()


def committed_batches(group: Any) -> asyncio.Queue[list[int]]:
    """The run ids of each group as it commits (the group's own commit, wrapped)."""
    committed: asyncio.Queue[list[int]] = asyncio.Queue()
    commit = group.commit

    async def counted(items: Any) -> Any:
        results = await commit(items)
        committed.put_nowait([run_id for run_id, _ in items])
        return results

    group.commit = counted
    return committed


@pytest.mark.parametrize("second_of_its_own", [False, True], ids=["group", "own transaction"])
def test_the_next_batch_commits_during_a_slow_publish_and_is_published_after_it(
    monkeypatch: pytest.MonkeyPatch, second_of_its_own: bool
) -> None:
    run = factories.RunFactory(status="running")
    doorbell = Doorbell(monkeypatch, hold_first=True)

    async def scenario() -> None:
        writer = JournalWriter(run.pk, window_ms=0)
        committed = committed_batches(group_commit())
        first = asyncio.ensure_future(writer.flush([NewEvent("run.started", {"status": "running"})]))
        await asyncio.wait_for(doorbell.held.wait(), 10)  # run.started committed, its publish held
        if second_of_its_own:  # a write with a transaction of its own publishes from the writer
            second = asyncio.ensure_future(writer.flush([delta("first token")], also=lambda: None))
            await asyncio.wait_for(until_rows(run, 2), 10)
        else:
            second = asyncio.ensure_future(writer.flush([delta("first token")]))
            await asyncio.wait_for(committed.get(), 10)  # run.started's group
            await asyncio.wait_for(committed.get(), 10)  # committed while run.started's publish hangs
        await loop_turns()
        assert doorbell.sent == [(run.pk, [1])]  # the token's notification waits behind it
        assert not first.done() and not second.done()  # a flush returns once its viewers are told
        doorbell.release.set()
        await asyncio.wait_for(asyncio.gather(first, second), 10)
        await group_commit().close()

    asyncio.run(scenario())
    assert doorbell.sent == [(run.pk, [1]), (run.pk, [2])]
    assert [t for t, _ in rows(run)] == ["run.started", "token.delta"]


def test_a_flush_with_nothing_to_write_returns_once_the_runs_earlier_notifications_have_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The lock is let go before the publish: a flush that finds the buffer taken must still
    # not return before what was taken is announced (a caller's "flush, then it is shown").
    run = factories.RunFactory(status="running")
    doorbell = Doorbell(monkeypatch, hold_first=True)

    async def scenario() -> None:
        writer = JournalWriter(run.pk, window_ms=0)
        first = asyncio.ensure_future(writer.flush([delta("written")]))
        await asyncio.wait_for(doorbell.held.wait(), 10)
        nothing = asyncio.ensure_future(writer.flush())
        await loop_turns()
        assert not nothing.done()
        doorbell.release.set()
        assert await asyncio.wait_for(nothing, 10) == []
        await first

    asyncio.run(scenario())
    assert doorbell.sent == [(run.pk, [1])]


async def loop_turns(count: int = 50) -> None:
    """Let every task that is ready run, `count` times over."""
    for _ in range(count):
        await asyncio.sleep(0)


async def until_rows(run: Any, count: int) -> None:
    while len(await asyncio.to_thread(rows, run)) < count:
        await asyncio.sleep(0.01)


def test_the_end_of_the_turn_is_written_and_published_after_every_earlier_notification(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # turns.finish_run publishes from its own transaction's commit, on another thread: the
    # writer must not start it while an earlier batch's notification is still on its way.
    run = factories.RunFactory(status="running")
    doorbell = Doorbell(monkeypatch, hold_first=True)
    real_finish = turns.finish_run
    order: list[str] = []

    def finish_run(run_id: int, events: Any, **updates: Any) -> Any:
        order.append("finish written")
        return real_finish(run_id, events, **updates)

    monkeypatch.setattr(turns, "finish_run", finish_run)

    async def scenario() -> None:
        writer = JournalWriter(run.pk, window_ms=0)
        flushed = asyncio.ensure_future(writer.flush([delta("answer")]))
        await asyncio.wait_for(doorbell.held.wait(), 10)
        finishing = asyncio.ensure_future(writer.finish([journal.done_event(RunStatus.COMPLETED)]))
        await loop_turns()
        # The same thread as finish_run's: had the writer handed it over, it ran before this.
        await sync_to_async(lambda: None)()
        assert order == []
        order.append("answer published")
        doorbell.release.set()
        await asyncio.wait_for(asyncio.gather(flushed, finishing), 10)

    asyncio.run(scenario())
    assert order == ["answer published", "finish written"]
    assert doorbell.sent == [(run.pk, [1]), (run.pk, [2])]


def test_closing_the_loops_group_sends_what_was_committed_even_for_a_flush_given_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A runner stopping closes its group commit: nothing committed stays unannounced.
    run = factories.RunFactory(status="running")
    doorbell = Doorbell(monkeypatch, hold_first=True)

    async def scenario() -> None:
        writer = JournalWriter(run.pk, window_ms=0)
        flushed = asyncio.ensure_future(writer.flush([delta("committed")]))
        await asyncio.wait_for(doorbell.held.wait(), 10)
        flushed.cancel()  # its execution aborted while the notification was on its way
        closing = asyncio.ensure_future(group_commit().close())
        await loop_turns()
        assert not closing.done()
        doorbell.release.set()
        await asyncio.wait_for(closing, 10)

    asyncio.run(scenario())
    assert doorbell.sent == [(run.pk, [1])]
    assert [t for t, _ in rows(run)] == ["token.delta"]


def test_many_runs_flushing_at_once_publish_each_batch_once_in_each_runs_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runs = [factories.RunFactory(status="running") for _ in range(3)]
    doorbell = Doorbell(monkeypatch)

    async def scenario() -> None:
        writers = [JournalWriter(run.pk, window_ms=0) for run in runs]
        flushes = [writer.flush([delta(f"{n}")]) for n in range(4) for writer in writers]
        await asyncio.wait_for(asyncio.gather(*flushes), 30)
        await group_commit().close()

    asyncio.run(scenario())
    for run in runs:
        seqs = [seq for run_id, batch in doorbell.sent if run_id == run.pk for seq in batch]
        assert seqs == [1, 2, 3, 4]


@pytest.mark.postgres
def test_a_write_found_landed_after_its_answer_was_lost_is_published_once_in_order(
    proxy: PgProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = factories.RunFactory(status="running")
    doorbell = Doorbell(monkeypatch)
    lost: list[BaseException] = []

    async def scenario() -> None:
        group, writer = writer_on_the_loop(run, lost, last_seq=0)
        await writer.flush([delta("before ")])
        proxy.lose_next_answer()  # committed, unanswered: read back, and published by the writer
        await writer.flush([delta("once ")])
        await writer.flush([delta("after")])
        await group.close()

    asyncio.run(scenario())
    assert lost == []
    assert doorbell.sent == [(run.pk, [1]), (run.pk, [2]), (run.pk, [3])]
