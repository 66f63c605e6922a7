"""A journal write the database did not answer is written exactly once: never lost, never twice.

The writer knows the run's last committed seq (the claim's, then each write's); after a
write fails on its connection it reads the run's rows after that seq to tell whether the
write landed, and writes it again only if it did not (runs/runner/writer.py, "exactly once").
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from django.db import OperationalError

from runs import journal, turns
from runs.journal import NewEvent
from runs.models import JournalEvent, Run, RunStatus
from runs.runner import connections
from runs.runner.writer import JournalWriter, group_commit
from tests import factories
from tests.support.pgproxy import UNENCRYPTED, PgProxy
from tests.test_writer import delta, holding_the_run_row, rows, until, writer_on_the_loop

pytestmark = pytest.mark.django_db(transaction=True)


def seqs(run: Any) -> list[int]:
    return list(JournalEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))


@pytest.fixture
def proxy(pg_proxy: PgProxy, monkeypatch: pytest.MonkeyPatch) -> PgProxy:
    """The runner's loop connections reach the database through a proxy the test controls."""
    direct = connections.connection_params

    def through_the_proxy() -> dict[str, Any]:
        return {**direct(), "host": "127.0.0.1", "port": pg_proxy.port, **UNENCRYPTED}

    monkeypatch.setattr(connections, "connection_params", through_the_proxy)
    return pg_proxy


@pytest.mark.postgres
def test_a_write_whose_answer_was_lost_after_it_committed_is_not_written_again(proxy: PgProxy) -> None:
    run = factories.RunFactory(status="running")
    lost: list[BaseException] = []
    written: list[list[JournalEvent]] = []

    async def scenario() -> None:
        group, writer = writer_on_the_loop(run, lost, last_seq=0)
        await writer.flush([delta("before ")])
        proxy.lose_next_answer()  # the server commits the next statement; its answer never arrives
        written.append(await writer.flush([delta("once ")]))
        await writer.flush([delta("after")])
        await group.close()

    asyncio.run(scenario())
    assert proxy.answers_lost == 1
    assert lost == []
    assert [(e.seq, e.payload["delta"]) for e in written[0]] == [(2, "once ")]
    assert [d["delta"] for _, d in rows(run)] == ["before ", "once ", "after"]
    assert seqs(run) == [1, 2, 3]


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("known", "written", "given_up"),
    [(0, ["before ", "cut ", "after"], False), (None, ["before ", "after"], True)],
    ids=["the writer knows the run's seq", "it does not"],
)
def test_a_write_cut_off_before_it_committed_is_written_again_by_a_writer_that_knows_the_runs_seq(
    known: int | None, written: list[str], given_up: bool
) -> None:
    run = factories.RunFactory(status="running")
    lost: list[BaseException] = []

    async def scenario() -> None:
        group, writer = writer_on_the_loop(run, lost, last_seq=known)
        await writer.flush([delta("before ")])
        backend = (await group.connection.get()).info.backend_pid
        with holding_the_run_row(run) as other:
            # The next write waits inside its statement for the row, and is cut there.
            writer.add([delta("cut ")])
            query = "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'"
            await until(lambda: other.execute(query, [backend]).fetchone() is not None)
            other.execute("SELECT pg_terminate_backend(%s)", [backend])
        # After the cut write is settled (the writer's lock), on another connection.
        await writer.flush([delta("after")])
        await group.close()

    asyncio.run(scenario())
    assert [d["delta"] for _, d in rows(run)] == written
    assert seqs(run) == list(range(1, len(written) + 1))
    # Without the seq it cannot tell whether the write landed: the run is told, and fails.
    assert [type(e) for e in lost] == ([OperationalError] if given_up else [])


@pytest.mark.postgres
def test_a_final_write_whose_answer_was_lost_ends_the_run_once(monkeypatch: pytest.MonkeyPatch) -> None:
    run = factories.RunFactory(status="running")
    real = turns.finish_run

    def committed_then_unanswered(run_id: int, events: Any, **updates: Any) -> Any:
        real(run_id, events, **updates)
        raise OperationalError("server closed the connection unexpectedly")

    async def scenario() -> list[JournalEvent]:
        writer = JournalWriter(run.pk, window_ms=0, last_seq=0)
        await writer.flush([delta("answer")])
        monkeypatch.setattr(turns, "finish_run", committed_then_unanswered)
        return await writer.finish([journal.done_event(RunStatus.COMPLETED)])

    final = asyncio.run(scenario())
    assert [e.type for e in final] == ["done"]
    assert [t for t, _ in rows(run)] == ["token.delta", "done"]
    assert Run.objects.get(pk=run.pk).status == RunStatus.COMPLETED


def test_a_write_that_lands_nowhere_until_the_deadline_fails_the_run(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.HERMESWEB_DB_RETRY_SECONDS = 0.3
    run = factories.RunFactory(status="running")
    lost: list[BaseException] = []

    async def unreachable(self: Any, run_id: int, batch: Any) -> Any:
        raise OperationalError("connection refused")

    async def scenario() -> None:
        writer = JournalWriter(run.pk, window_ms=0, last_seq=0)
        writer.on_lost = lost.append
        monkeypatch.setattr(type(group_commit()), "write", unreachable)
        writer.add([delta("never")])
        await until(lambda: bool(lost))

    asyncio.run(scenario())
    assert len(lost) == 1 and isinstance(lost[0], OperationalError)
    assert rows(run) == []


def test_a_run_another_runner_ended_while_its_write_went_unanswered_is_not_written_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = factories.RunFactory(status="running")

    async def reaped_meanwhile(self: Any, run_id: int, batch: Any) -> Any:
        # A reaper's terminal lands (two events, as many as our batch) while ours went unanswered.
        def reap() -> None:
            turns.do_mark_interrupted(Run.objects.get(pk=run_id), "lease expired")

        await asyncio.to_thread(reap)
        raise OperationalError("server closed the connection unexpectedly")

    async def scenario() -> None:
        writer = JournalWriter(run.pk, window_ms=0, last_seq=0)
        monkeypatch.setattr(type(group_commit()), "write", reaped_meanwhile)
        with pytest.raises(journal.AlreadyTerminal):
            await writer.flush([delta("a"), NewEvent("progress", {"text": "b"})])

    asyncio.run(scenario())
    assert [t for t, _ in rows(run)] == ["error", "done"]


def test_a_batch_as_the_writer_compares_it_is_what_its_rows_hold() -> None:
    # The read-back compares rows with the batch: redacted, through JSON, big integers included.
    run = factories.RunFactory(status="running")
    payload = {"n": 2**70, "x": 1.5, "api_key": "sk-abcdef1234567890abcdef", "text": "é 😀", 3: "k"}
    events = [NewEvent("tool.updated", payload), delta("a")]
    journal.append_batch(run.pk, events)

    assert rows(run) == journal.as_written(events)
