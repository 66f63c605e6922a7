"""Replay's fast paths spell each envelope as the model does (`JournalEvent.envelope()`), on either database.

`journal.read_encoded` (the socket's catch-up) and `journal.read_encoded_array` (the polling API's
body; built by the database itself on SQLite) never decode a payload: these prove their text
parses to exactly the model's envelope — same keys in the same order, same values — and that
the two spell every envelope byte for byte alike, for payloads that are awkward to splice.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from runs import journal
from runs.models import JournalEvent, Run
from tests.factories import run_with_events

pytestmark = pytest.mark.django_db

AWKWARD: list[tuple[str, dict[str, Any]]] = [
    ("token.delta", {"message_id": "m", "delta": 'quote " backslash \\ slash / newline \n tab \t cr \r'}),
    ("token.delta", {"delta": "ünïcödé — 日本語 🚀 \u2028 \u2029 \ufeff é"}),
    ("token.delta", {"delta": "controls \x01 \x1f \x7f and an escaped NUL as text: \\u0000"}),
    (
        "tool.updated",
        {"tool_call_id": "t", "raw": {"n": [1, 2.5, -3e-7, None, True, False], "e": {}, "l": []}},
    ),
    ("usage", {"input_tokens": 2**53 + 1, "cost": 0.1, "tiny": 5e-324, "huge": 1.7976931348623157e308}),
    ("usage", {"big": 2**64, "negative": -(2**63), "zero": 0.0, "minus_zero": -0.0}),
    ("progress", {}),
    ("progress", {"deep": {"a": {"b": {"c": [[[{"d": "ë"}]]]}}}, "": "empty key", "ключ": "значение"}),
    ("tool.updated", {"tool_call_id": "t", "api_key": "sk-live-0123456789abcdefghijklmnop", "text": "ok"}),
    ("tool.updated", {"output": "Authorization: Bearer abcdefghijklmnopqrstuvwxyz0123456789"}),
    ('odd type "quoted" ü', {"x": 1}),
]


def awkward_run(**run_fields: Any) -> Run:
    events = list(AWKWARD)
    if connection.vendor == "sqlite":
        # PostgreSQL stores no NUL (the edge refuses it); SQLite's JSON text holds it escaped.
        events.append(("token.delta", {"delta": "a real NUL: \x00 end", "k\x00ey": "v"}))
    run = run_with_events(events, **run_fields)
    journal.append_batch(run.pk, [journal.done_event("completed", reason="ok")], publish=False)
    run.refresh_from_db()
    set_times(
        run,
        {
            1: datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),  # stored without a fraction
            2: datetime(2026, 1, 2, 3, 4, 5, 999999, tzinfo=UTC),
            3: datetime(2026, 1, 2, 3, 4, 5, 1, tzinfo=UTC),
            4: datetime(1970, 1, 1, 0, 0, 0, 500000, tzinfo=UTC),
            5: datetime(2038, 1, 19, 3, 14, 8, 123456, tzinfo=UTC),
            6: datetime(2024, 2, 29, 23, 59, 59, 100000, tzinfo=UTC),
        },
    )
    return run


def set_times(run: Run, times: dict[int, datetime]) -> None:
    # As rows written then would be, before SQLite kept their text (tests/test_stored_envelopes.py
    # writes at such times): the readers spell these.
    for seq, at in times.items():
        JournalEvent.objects.filter(run=run, seq=seq).update(created_at=at, envelope_json=None)


def model_envelopes(run: Run, after_seq: int = 0) -> list[dict[str, Any]]:
    return [
        event.envelope(run.session_id) for event in JournalEvent.objects.filter(run=run, seq__gt=after_seq)
    ]


def assert_same_envelopes(parsed: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    assert parsed == expected
    assert [list(e) for e in parsed] == [list(e) for e in expected]  # keys in the model's order
    assert [type(e["created_at"]) for e in parsed] == [float] * len(expected)


def test_encoded_rows_parse_to_exactly_the_model_envelopes_for_awkward_payloads() -> None:
    run = awkward_run()

    page = journal.read_encoded(run, 0)

    assert_same_envelopes([json.loads(text) for _, _, text in page.rows], model_envelopes(run))
    assert [row[:2] for row in page.rows] == [(e["seq"], e["terminal"]) for e in model_envelopes(run)]


def test_the_polling_array_spells_each_envelope_as_the_socket_rows_do_byte_for_byte() -> None:
    run = awkward_run()

    array = journal.read_encoded_array(run, 0)
    page = journal.read_encoded(run, 0)

    assert array.text == page.json_array()
    assert_same_envelopes(json.loads(array.text), model_envelopes(run))
    assert (array.last_seq, array.terminal, array.has_more) == (page.last_seq, page.terminal, page.has_more)


def test_secrets_stay_redacted_in_both_replays() -> None:
    run = awkward_run()

    text = journal.read_encoded_array(run, 0).text

    assert "sk-live-0123456789" not in text and "abcdefghijklmnopqrstuvwxyz0123456789" not in text
    assert text == journal.read_encoded(run, 0).json_array()


@pytest.mark.parametrize("after_seq", [0, 1, 5, 11, 12])
@pytest.mark.parametrize("limit", [1, 3, 100])
def test_the_polling_array_pages_as_the_socket_rows_do(settings: Any, after_seq: int, limit: int) -> None:
    run = awkward_run()
    settings.HERMESWEB_EVENTS_PAGE_MAX = 50

    array = journal.read_encoded_array(run, after_seq, limit)
    page = journal.read_encoded(run, after_seq, limit)

    assert array.text == page.json_array()
    assert (array.last_seq, array.terminal, array.has_more) == (page.last_seq, page.terminal, page.has_more)
    assert_same_envelopes(json.loads(array.text), model_envelopes(run, after_seq)[:limit])


def test_the_polling_array_of_an_unfinished_run_says_there_is_more() -> None:
    run = run_with_events([("token.delta", {"delta": str(i)}) for i in range(5)])

    array = journal.read_encoded_array(run, 1, 2)

    assert [e["seq"] for e in json.loads(array.text)] == [2, 3]
    assert (array.last_seq, array.terminal, array.has_more) == (5, False, True)
    empty = journal.read_encoded_array(run, 5)
    assert (empty.text, empty.last_seq, empty.terminal, empty.has_more) == ("[]", 5, False, False)


def test_the_polling_array_reads_across_a_compacted_range() -> None:
    run = run_with_events([("progress", {"i": i}) for i in range(8)])
    JournalEvent.objects.filter(run=run, seq__in=[2, 3, 4]).delete()
    Run.objects.filter(pk=run.pk).update(compacted_through=4)
    run.refresh_from_db()

    array = journal.read_encoded_array(run, 0, 3)

    assert [e["seq"] for e in json.loads(array.text)] == [1, 5, 6]
    assert array.text == journal.read_encoded(run, 0, 3).json_array()
    assert array.has_more


def test_the_events_endpoint_serves_the_fast_paths_text(api: Client, session: Any) -> None:
    run = awkward_run(session=session)

    response = api.get(f"/api/runs/{run.pk}/events?after_seq=2&limit=5")

    assert response.status_code == 200
    body = response.content.decode()
    assert f'"events":{journal.read_encoded(run, 2, 5).json_array()},' in body
    assert_same_envelopes(response.json()["events"], model_envelopes(run, 2)[:5])
