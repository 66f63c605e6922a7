"""On SQLite each journal row keeps its envelope's JSON text, spelled when it is written
(`envelope_json`, docs/journal.md "Reading"): the replays read it back instead of building it.

A copy of what the row says must never say something else: these prove the stored text parses to
exactly the model's envelope and is byte for byte what a reader spells from the row's columns,
for every way rows are written, at awkward times, and after compaction rewrites a payload; and
that a row whose payload is long keeps no copy.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from unittest import mock

import pytest
from django.db import transaction

from runs import journal
from runs.journal.rows import STORED_ENVELOPE_MAX_PAYLOAD
from runs.management.commands.compact_journal import compact_run
from runs.models import JournalEvent, Run
from tests.factories import RunFactory, run_with_events
from tests.test_replay_envelopes import AWKWARD, assert_same_envelopes, model_envelopes

pytestmark = pytest.mark.django_db


def stored(run: Run) -> list[str | None]:
    return list(JournalEvent.objects.filter(run=run).order_by("seq").values_list("envelope_json", flat=True))


def spelled_by_readers(run: Run) -> str:
    """The page as readers spell it from the row's columns, with no stored text to read."""
    with transaction.atomic():
        JournalEvent.objects.filter(run=run).update(envelope_json=None)
        text = journal.read_encoded_array(run, 0).text
        transaction.set_rollback(True)
    return text


def finished_awkward_run() -> Run:
    nul = ("token.delta", {"delta": "a real NUL: \x00 end", "k\x00ey": "v"})
    run = run_with_events([*AWKWARD, nul])
    journal.append_batch(run.pk, [journal.done_event("completed", reason="ok")], publish=False)
    run.refresh_from_db()
    return run


@pytest.mark.sqlite
def test_each_row_written_keeps_its_envelope_exactly_as_the_model_and_the_readers_spell_it() -> None:
    run = finished_awkward_run()

    texts = stored(run)

    assert None not in texts
    assert_same_envelopes([json.loads(text) for text in texts], model_envelopes(run))
    assert "[" + ",".join(texts) + "]" == spelled_by_readers(run)
    # And the replays hand out the stored text itself.
    assert journal.read_encoded_array(run, 0).text == "[" + ",".join(texts) + "]"
    assert [text for _, _, text in journal.read_encoded(run, 0).rows] == texts


@pytest.mark.sqlite
def test_a_group_of_runs_written_together_keeps_each_rows_envelope_with_its_own_run_and_session() -> None:
    runs = [RunFactory(), RunFactory()]
    with transaction.atomic():
        results = journal.append_group_unpublished(
            [(run.pk, [journal.NewEvent("token.delta", {"delta": f"run {run.pk}"})] * 3) for run in runs]
        )
    assert all(isinstance(result, journal.Appended) for result in results)

    for run in runs:
        run.refresh_from_db()
        texts = stored(run)
        assert_same_envelopes([json.loads(text) for text in texts], model_envelopes(run))
        assert "[" + ",".join(texts) + "]" == spelled_by_readers(run)


@pytest.mark.sqlite
@pytest.mark.parametrize(
    "at",
    [
        datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),  # stored without a fraction
        datetime(2026, 1, 2, 3, 4, 5, 999999, tzinfo=UTC),
        datetime(2026, 1, 2, 3, 4, 5, 1, tzinfo=UTC),
        datetime(1970, 1, 1, 0, 0, 0, 500000, tzinfo=UTC),
        datetime(2038, 1, 19, 3, 14, 8, 123456, tzinfo=UTC),
        datetime(2024, 2, 29, 23, 59, 59, 100000, tzinfo=UTC),
    ],
)
def test_the_time_is_stored_as_the_readers_spell_it_at_awkward_moments(at: datetime) -> None:
    run = RunFactory()
    with mock.patch("runs.journal.append.timezone.now", return_value=at):
        journal.append_batch(run.pk, [journal.NewEvent("progress", {"at": str(at)})], publish=False)
    run.refresh_from_db()

    (text,) = stored(run)

    assert json.loads(text)["created_at"] == at.timestamp()
    assert_same_envelopes([json.loads(text)], model_envelopes(run))
    assert f"[{text}]" == spelled_by_readers(run)


@pytest.mark.sqlite
def test_a_row_with_a_long_payload_keeps_no_copy_and_reads_the_same() -> None:
    long = "x" * STORED_ENVELOPE_MAX_PAYLOAD
    run = run_with_events([("tool.updated", {"output": long}), ("token.delta", {"delta": "short"})])

    assert [text is None for text in stored(run)] == [True, False]
    page = journal.read_encoded_array(run, 0).text
    assert page == spelled_by_readers(run) == journal.read_encoded(run, 0).json_array()
    assert_same_envelopes(json.loads(page), model_envelopes(run))


@pytest.mark.sqlite
def test_rows_without_a_stored_envelope_read_the_same_as_rows_with_one() -> None:
    run = finished_awkward_run()
    whole = journal.read_encoded_array(run, 0).text
    # Rows written before the column existed: every other one.
    JournalEvent.objects.filter(run=run, seq__in=range(1, run.last_seq + 1, 2)).update(envelope_json=None)

    assert journal.read_encoded_array(run, 0).text == whole
    assert journal.read_encoded(run, 0).json_array() == whole
    for after_seq, limit in [(0, 1), (1, 3), (4, 5)]:
        page = journal.read_encoded(run, after_seq, limit)
        assert journal.read_encoded_array(run, after_seq, limit).text == page.json_array()


@pytest.mark.sqlite
def test_compaction_drops_the_stored_text_of_the_rows_it_rewrites() -> None:
    parts = ("Hel", "lo", "!")
    run = run_with_events([("token.delta", {"message_id": "m", "delta": part}) for part in parts])
    journal.append_batch(run.pk, [journal.done_event("completed")], publish=False)
    run.refresh_from_db()

    assert compact_run(run) == 2
    run.refresh_from_db()

    first = JournalEvent.objects.get(run=run, seq=1)
    assert first.payload["delta"] == "Hello!" and first.envelope_json is None
    page = json.loads(journal.read_encoded_array(run, 0).text)
    assert [event["payload"].get("delta") for event in page] == ["Hello!", None]
    assert_same_envelopes(page, model_envelopes(run))


@pytest.mark.postgres
def test_postgresql_keeps_no_copy_of_the_envelope(session: Any) -> None:
    run = run_with_events([("token.delta", {"delta": "hi"})], session=session)

    assert stored(run) == [None]
    assert_same_envelopes(json.loads(journal.read_encoded_array(run, 0).text), model_envelopes(run))
