"""The journal writer coalesces deltas and keeps arrival order."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from runs.journal import NewEvent
from runs.models import JournalEvent
from runs.runner.writer import JournalWriter
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)


def delta(text: str, message_id: str = "m1") -> NewEvent:
    return NewEvent("token.delta", {"message_id": message_id, "delta": text})


@contextlib.contextmanager
def holding_the_run_row(run: Any) -> Iterator[Any]:
    """Another connection holds the run's row (FOR UPDATE) until the block ends: writes wait."""
    import psycopg

    from runs.runner import connections

    with psycopg.connect(**connections.connection_params(), autocommit=True) as other, other.transaction():
        other.execute("SELECT 1 FROM runs_run WHERE id = %s FOR UPDATE", [run.pk])
        yield other


async def until(condition: Any, timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def writer_on_the_loop(run: Any, lost: list[BaseException], last_seq: int | None = None) -> Any:
    """(group, writer): a writer whose group commits go from this loop, as in a runner (PostgreSQL).

    Writes it gives up on are reported to `lost`.
    """
    from runs.runner.writer import group_commit

    group = group_commit()
    group.write_from_loop()
    assert group.connection is not None
    writer = JournalWriter(run.pk, window_ms=0, last_seq=last_seq)
    writer.on_lost = lost.append
    return group, writer


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
        writer.add([delta("ok")])  # not "x": that could begin a secret (`xoxb-`) and is held
        for _ in range(200):
            if await asyncio.to_thread(JournalEvent.objects.filter(run=run).exists):
                return
            await asyncio.sleep(0.01)

    asyncio.run(scenario())
    assert rows(run) == [("token.delta", {"message_id": "m1", "delta": "ok"})]


def test_the_first_delta_after_run_started_is_not_held_for_the_window() -> None:
    # run.started is written as the agent is prompted; the turn's first token, ~3 ms later,
    # must go at once, not a coalescing window later.
    run = factories.RunFactory(status="running")

    def written() -> list[str]:
        return list(JournalEvent.objects.filter(run=run).order_by("seq").values_list("type", flat=True))

    async def scenario() -> None:
        writer = JournalWriter(run.pk, window_ms=60_000)
        writer.add([NewEvent("run.started", {"status": "running"})])
        await writer.flush()
        writer.add([delta("first")])
        # Written now, not in a minute.
        for _ in range(500):
            if len(await asyncio.to_thread(written)) == 2:
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the first delta waited for the window")
        writer.add([delta(" second")])  # and the window paces the deltas after it
        await asyncio.sleep(0.3)
        assert await asyncio.to_thread(written) == ["run.started", "token.delta"]
        await writer.flush()

    asyncio.run(scenario())
    assert [t for t, _ in rows(run)] == ["run.started", "token.delta", "token.delta"]


def test_the_first_token_does_not_wait_for_run_starteds_sidebar_doorbell(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # run.started rings its owner's sidebar doorbell (a lookup and a publish); awaited under
    # the writer's lock, it held back the turn's first token. Here the ring never finishes.
    from runs import notify

    run = factories.RunFactory(status="running")
    owner = run.session.project.owner_id
    rung: list[set[Any]] = []

    async def hung_ring(user_ids: set[Any]) -> None:
        rung.append(set(user_ids))
        await asyncio.Event().wait()

    monkeypatch.setattr(notify, "apublish_user_sessions_changed", hung_ring)

    async def scenario() -> None:
        writer = JournalWriter(run.pk, window_ms=60_000)
        writer.add([NewEvent("run.started", {"status": "running"})])
        writer.add([delta("ok")])  # nothing of it held back (see the window test above)
        await asyncio.wait_for(writer.flush(), 10)  # the group path (plain events)
        status = NewEvent("status", {"status": "running"})
        await asyncio.wait_for(writer.flush([status], also=lambda: None), 10)  # a transaction of its own
        await until(lambda: len(rung) == 2)  # and the doorbell was rung, each time, after commit

    asyncio.run(scenario())
    assert [t for t, _ in rows(run)] == ["run.started", "token.delta", "status"]
    assert rung == [{owner}, {owner}]


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


def test_runs_flushing_together_share_a_transaction_and_keep_their_own_seqs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from runs.runner import writer as writer_module

    runs = [factories.RunFactory(status="running") for _ in range(5)]
    groups: list[int] = []
    real = writer_module.write_group

    def spy(items: list[tuple[int, list[NewEvent]]]) -> list[Any]:
        groups.append(len(items))
        return real(items)

    monkeypatch.setattr(writer_module, "write_group", spy)

    async def scenario() -> None:
        writers = [JournalWriter(run.pk, window_ms=10_000) for run in runs]
        for round_ in range(3):
            for index, writer in enumerate(writers):
                writer.add([delta(f"{index}.{round_} ")])
            await asyncio.gather(*(writer.flush() for writer in writers))

    asyncio.run(scenario())
    for index, run in enumerate(runs):
        got = list(JournalEvent.objects.filter(run=run).order_by("seq").values_list("seq", "payload"))
        assert [seq for seq, _ in got] == [1, 2, 3]
        assert [p["delta"] for _, p in got] == [f"{index}.{r} " for r in range(3)]
        run.refresh_from_db()
        assert run.last_seq == 3
    assert sum(groups) == 15
    assert max(groups) > 1  # flushes that met in the loop went in together


def test_a_run_that_ended_refuses_its_batch_alone_in_a_group() -> None:
    from runs.journal import AlreadyTerminal
    from runs.runner.writer import write_group

    live, ended, other = (factories.RunFactory(status=s) for s in ("running", "completed", "running"))
    bad_batch = [NewEvent("done", {"state": "completed"}), delta("after the end")]  # done not last

    results = write_group(
        [
            (live.pk, [delta("a")]),
            (ended.pk, [delta("b")]),
            (other.pk, [delta("c")]),
            (live.pk + 10**6, [delta("d")]),
        ]
    )
    assert isinstance(results[1], AlreadyTerminal)
    assert isinstance(results[3], type(live).DoesNotExist)
    assert [r.rows[0].payload["delta"] for r in (results[0], results[2])] == ["a", "c"]  # type: ignore[union-attr]

    # A failure of any other kind rolls the group back; each batch is then tried alone.
    results = write_group([(live.pk, [delta("e")]), (other.pk, bad_batch)])
    assert isinstance(results[1], ValueError)
    assert rows(live) == [("token.delta", {"message_id": "m1", "delta": d}) for d in ("a", "e")]
    assert rows(other) == [("token.delta", {"message_id": "m1", "delta": "c"})]
    assert not JournalEvent.objects.filter(run=ended).exists()


@pytest.mark.postgres
def test_a_runners_groups_sent_from_its_loop_get_the_answers_the_database_thread_gives() -> None:
    from runs.journal import AlreadyTerminal
    from runs.runner.writer import GroupCommit

    live, ended, other = (factories.RunFactory(status=s) for s in ("running", "completed", "running"))
    bad_batch = [NewEvent("done", {"state": "completed"}), delta("after the end")]  # done not last

    async def scenario() -> list[list[Any]]:
        group = GroupCommit()
        group.write_from_loop()
        try:
            first = await group.commit(
                [
                    (live.pk, [delta("a")]),
                    (ended.pk, [delta("b")]),
                    (other.pk, [delta("c"), delta("d", "m2")]),
                ]
            )
            second = await group.commit([(live.pk, [delta("e")]), (other.pk, bad_batch)])
            return [first, second]
        finally:
            await group.close()

    first, second = asyncio.run(scenario())
    assert isinstance(first[1], AlreadyTerminal)
    written = [event for result in (first[0], first[2]) for event in result.rows]  # type: ignore[union-attr]
    stored = {(e.run_id, e.seq): e.pk for e in JournalEvent.objects.filter(run__in=[live, other])}
    assert [(e.run_id, e.seq, e.payload["delta"]) for e in written] == [
        (live.pk, 1, "a"),
        (other.pk, 1, "c"),
        (other.pk, 2, "d"),
    ]
    assert all(e.pk == stored[(e.run_id, e.seq)] for e in written)
    assert first[0].to_publish is True  # type: ignore[union-attr]  # committed here: the caller publishes
    # A failure of any other kind: each batch alone, as in the database thread.
    assert isinstance(second[1], ValueError)
    assert [d["delta"] for _, d in rows(live)] == ["a", "e"]
    assert [d["delta"] for _, d in rows(other)] == ["c", "d"]
    assert not JournalEvent.objects.filter(run=ended).exists()


@pytest.mark.postgres
def test_a_group_refused_on_a_live_loop_connection_is_written_again_one_by_one() -> None:

    run = factories.RunFactory(status="running")
    lost: list[BaseException] = []

    async def scenario() -> None:
        group, writer = writer_on_the_loop(run, lost)
        loop_conn = await group.connection.get()
        await loop_conn.execute("SET lock_timeout = '50ms'")
        with holding_the_run_row(run) as other:
            # The group's statement gives up (lock_timeout) and rolls back on a connection that
            # stays up; the batch's own write then waits here, on another backend.
            flushing = asyncio.ensure_future(writer.flush([delta("kept")]))
            waiting = "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid NOT IN (%s, %s)"
            pids = [loop_conn.info.backend_pid, other.info.backend_pid]
            await until(lambda: other.execute(waiting, pids).fetchone() is not None)
        await flushing
        assert not loop_conn.closed
        await group.close()

    asyncio.run(scenario())
    assert lost == []
    assert rows(run) == [("token.delta", {"message_id": "m1", "delta": "kept"})]


@pytest.mark.postgres
def test_a_group_refused_on_a_live_thread_connection_is_written_again_one_by_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.db import OperationalError

    from runs import journal
    from runs.runner.writer import write_group

    first, second = factories.RunFactory(status="running"), factories.RunFactory(status="running")

    real = journal.append_group_unpublished
    calls: list[int] = []

    def refused_once(items: Any) -> Any:
        calls.append(len(items))
        if len(calls) == 1:  # the group's statement; the batches alone are groups of one again
            raise OperationalError("deadlock detected")  # as psycopg's, wrapped: the connection is fine
        return real(items)

    # The writer calls the journal's face; a batch alone goes through the append module itself.
    monkeypatch.setattr(journal, "append_group_unpublished", refused_once)
    monkeypatch.setattr("runs.journal.append.append_group_unpublished", refused_once)
    results = write_group([(first.pk, [delta("a")]), (second.pk, [delta("b")])])

    assert not any(isinstance(result, Exception) for result in results)
    assert calls == [2, 1, 1]
    assert rows(first) == [("token.delta", {"message_id": "m1", "delta": "a"})]
    assert rows(second) == [("token.delta", {"message_id": "m1", "delta": "b"})]
