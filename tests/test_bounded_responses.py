"""Transcript, rendered turns and exports stay bounded however long a session grows.

The transcript and the session's fragments come a page of turns at a time (newest first, `before`
cursor, `has_more`), each page also stopping at HERMESWEB_TRANSCRIPT_PAGE_BYTES; a single run
larger than that comes cut short (`complete` false) and is read on from its events. A page of
a run's events also stops at HERMESWEB_EVENTS_PAGE_CHARS of payloads. The export streams a run
at a time.
"""

from __future__ import annotations

import http.client
import re
import tracemalloc
from typing import Any

import orjson
import pytest
from django.test import Client

from runs import journal, transcript_pages
from runs.models import Run
from runs.transcript import materialize
from runs.transcript_pages import PAGE_TURNS, PAGE_TURNS_MAX
from tests import factories
from tests.support.live import LiveStack, layer, live  # noqa: F401
from tests.support.runs import follow_event_pages

pytestmark = pytest.mark.django_db

KIB = 1024


def settled(session: Any, text: str = "Done.", deltas: int = 1, **fields: Any) -> Any:
    events = [("token.delta", {"message_id": "m", "delta": text})] * deltas
    run = factories.run_with_events(
        [*events, ("done", {"state": "completed"})], session=session, status="running", **fields
    )
    run.status = "completed"
    run.save(update_fields=["status"])
    return run


def transcript(api: Client, session: Any, **query: Any) -> dict[str, Any]:
    response = api.get(f"/api/sessions/{session.pk}/transcript", query)
    assert response.status_code == 200, response.content
    return response.json()


# ---------------------------------------------------------------- the transcript API


def test_the_transcript_is_the_newest_page_and_pages_back_to_the_first_turn(
    api: Client, session: Any
) -> None:
    runs = [settled(session, f"answer {n}") for n in range(PAGE_TURNS + 5)]

    newest = transcript(api, session)
    older = transcript(api, session, before=newest["before"])

    assert [t["run_id"] for t in newest["turns"]] == [r.pk for r in runs[5:]]
    assert newest["has_more"] is True and newest["before"] == runs[5].pk
    assert [t["run_id"] for t in older["turns"]] == [r.pk for r in runs[:5]]
    assert older["has_more"] is False and older["before"] is None
    assert all(t["complete"] for t in newest["turns"] + older["turns"])


def test_a_short_session_is_one_page_as_before(api: Client, session: Any) -> None:
    run = settled(session, "Hi")

    body = transcript(api, session)

    assert [t["run_id"] for t in body["turns"]] == [run.pk]
    assert body["has_more"] is False and body["turns"][0]["state"]["items"][0]["text"] == "Hi"


def test_the_page_size_is_capped(api: Client, session: Any) -> None:
    response = api.get(f"/api/sessions/{session.pk}/transcript", {"limit": PAGE_TURNS_MAX + 1})

    assert response.status_code == 422
    assert response.json()["code"] == "validation_error"


def test_a_page_stops_at_its_byte_budget(api: Client, session: Any, settings: Any) -> None:
    settings.HERMESWEB_TRANSCRIPT_PAGE_BYTES = 64 * KIB
    runs = [settled(session, "x" * 10 * KIB) for _ in range(12)]

    newest = transcript(api, session)

    assert 1 < len(newest["turns"]) < len(runs)
    assert newest["has_more"] is True and newest["before"] == newest["turns"][0]["run_id"]
    assert newest["turns"][-1]["run_id"] == runs[-1].pk


def test_one_enormous_run_comes_cut_short_and_is_read_on_from_its_events(
    api: Client, session: Any, settings: Any
) -> None:
    settings.HERMESWEB_TRANSCRIPT_PAGE_BYTES = 64 * KIB
    older = settled(session, "before")
    huge = settled(session, "y" * 8 * KIB, deltas=128)  # 1 MiB of text

    response = api.get(f"/api/sessions/{session.pk}/transcript")
    body = response.json()

    assert len(response.content) < 3 * 64 * KIB
    [turn] = body["turns"]
    assert turn["run_id"] == huge.pk and turn["complete"] is False
    assert 0 < turn["state"]["last_seq"] < huge.last_seq and turn["state"]["terminal"] is False
    assert body["has_more"] is True and body["before"] == huge.pk
    rest = api.get(f"/api/runs/{huge.pk}/events", {"after_seq": turn["state"]["last_seq"]}).json()
    whole = materialize([*huge.events.order_by("seq")])
    caught_up = materialize([*huge.events.filter(seq__lte=turn["state"]["last_seq"]), *rest["events"]])
    assert caught_up["text"] == whole["text"] and caught_up["terminal"]
    assert [t["run_id"] for t in transcript(api, session, before=body["before"])["turns"]] == [older.pk]


def test_a_merge_reads_only_the_turns_newer_than_the_pages(api: Client, session: Any) -> None:
    first, second, third = (settled(session, f"answer {n}") for n in range(3))

    newer = transcript(api, session, after_run=second.pk)
    none = transcript(api, session, after_run=third.pk)
    one_of_two = transcript(api, session, after_run=first.pk, limit=1)

    assert [t["run_id"] for t in newer["turns"]] == [third.pk] and newer["has_more"] is False
    assert none["turns"] == [] and none["has_more"] is False and none["session_id"] == session.pk
    assert [t["run_id"] for t in one_of_two["turns"]] == [third.pk]
    assert one_of_two["has_more"] is True and one_of_two["before"] == third.pk
    bad = api.get(f"/api/sessions/{session.pk}/transcript", {"after_run": -1})
    assert bad.status_code == 422 and bad.json()["code"] == "validation_error"


def test_a_lone_cut_turn_says_no_older_turns_exist(api: Client, session: Any, settings: Any) -> None:
    settings.HERMESWEB_TRANSCRIPT_PAGE_BYTES = 64 * KIB
    huge = settled(session, "y" * 8 * KIB, deltas=16)

    body = transcript(api, session)

    assert [(t["run_id"], t["complete"]) for t in body["turns"]] == [(huge.pk, False)]
    assert body["has_more"] is False and body["before"] is None


# ---------------------------------------------------------------- a run's events


def event_pages(api: Client, run: Any) -> list[list[dict[str, Any]]]:
    """Every page of the run's events from seq 0, following each page's next link."""
    return [page.events for page in follow_event_pages(api, f"/api/runs/{run.pk}/events")]


def payload_chars(events: list[dict[str, Any]]) -> int:
    return sum(len(orjson.dumps(event["payload"])) for event in events)


def test_an_events_page_stops_once_its_payloads_reach_the_page_chars(
    api: Client, session: Any, settings: Any
) -> None:
    settings.HERMESWEB_EVENTS_PAGE_CHARS = 64 * KIB
    run = settled(session, "z" * 16 * KIB, deltas=20)  # 20 deltas of 16 KiB, then done

    pages = event_pages(api, run)

    assert [e["seq"] for page in pages for e in page] == list(range(1, 22))
    # Each page holds events while those before them are under the budget, so at most one past it.
    assert [len(page) for page in pages] == [4, 4, 4, 4, 4, 1]
    assert all(payload_chars(page[:-1]) < 64 * KIB for page in pages)


def test_an_event_larger_than_the_page_chars_comes_alone_and_the_pages_go_on(
    api: Client, session: Any, settings: Any
) -> None:
    settings.HERMESWEB_EVENTS_PAGE_CHARS = 1024
    run = settled(session, "w" * 8 * KIB, deltas=3)

    pages = event_pages(api, run)

    assert [[e["seq"] for e in page] for page in pages] == [[1], [2], [3], [4]]
    assert pages[-1][0]["terminal"] is True


def test_a_page_read_with_a_char_bound_stops_where_the_api_page_does(session: Any) -> None:
    run = settled(session, "z" * 16 * KIB, deltas=20)

    page = journal.read_encoded(Run.objects.get(pk=run.pk), 0, max_chars=64 * KIB)

    assert [seq for seq, _, _ in page.rows] == [1, 2, 3, 4]
    assert page.has_more is True


@pytest.mark.parametrize("kib", [1, 7, 8, 9, 40, 41, 64])
def test_the_api_page_is_the_page_cut_at_the_bound_whichever_way_it_is_read(
    session: Any, settings: Any, kib: int
) -> None:
    # On SQLite the API's page is first read whole under a string limit, and cut only when
    # that is refused: either way it must be the page the bound describes.
    settings.HERMESWEB_EVENTS_PAGE_CHARS = kib * KIB
    run = Run.objects.get(pk=settled(session, "q" * 2 * KIB, deltas=20).pk)

    for after in (0, 5, 19):
        page = journal.read_encoded_array(run, after)
        cut = journal.read_encoded(run, after, max_chars=kib * KIB)
        assert orjson.loads(page.text) == [orjson.loads(text) for _, _, text in cut.rows]
        assert (page.has_more, page.next_after) == (cut.has_more, cut.rows[-1][0])


# ---------------------------------------------------------------- rendered turns


def fragment_runs(api: Client, url: str) -> list[int]:
    response = api.get(url)
    assert response.status_code == 200
    return [int(n) for n in re.findall(r'data-run="(\d+)"', response.content.decode())]


def test_the_session_fragment_is_the_transcripts_page(api: Client, session: Any) -> None:
    runs = [settled(session) for _ in range(PAGE_TURNS + 2)]

    newest = fragment_runs(api, f"/sessions/{session.pk}/fragment")
    older = fragment_runs(api, f"/sessions/{session.pk}/fragment?before={runs[2].pk}")

    assert newest == [r.pk for r in runs[2:]]
    assert older == [r.pk for r in runs[:2]]
    assert api.get(f"/sessions/{session.pk}/fragment?limit={PAGE_TURNS_MAX + 1}").status_code == 400
    assert api.get(f"/sessions/{session.pk}/fragment?before=x").status_code == 400


def test_named_fragments_stop_at_the_budget_and_a_too_large_turn_is_marked(
    api: Client, session: Any, settings: Any
) -> None:
    settings.HERMESWEB_TRANSCRIPT_PAGE_BYTES = 64 * KIB
    huge = settled(session, "y" * 8 * KIB, deltas=16)
    mid = [settled(session, "z" * 20 * KIB) for _ in range(5)]
    ids = ",".join(str(r.pk) for r in [huge, *mid])

    response = api.get(f"/sessions/{session.pk}/fragment?runs={ids}")
    body = response.content.decode()

    assert f'<section class="turn-fragment" data-run="{huge.pk}" data-too-large></section>' in body
    rendered = [int(n) for n in re.findall(r'data-run="(\d+)" data-last-seq', body)]
    assert rendered and rendered == [r.pk for r in mid[: len(rendered)]] and len(rendered) < len(mid)
    assert len(body) < 3 * 64 * KIB


def test_a_turn_plainly_too_large_is_marked_without_folding_its_events(
    api: Client, session: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.HERMESWEB_TRANSCRIPT_PAGE_BYTES = 64 * KIB
    monkeypatch.setattr(transcript_pages, "SIZE_CHECK_EVENTS", 10)
    huge = settled(session, "y" * 8 * KIB, deltas=32)  # 256 KiB: four page budgets
    newer = settled(session, "small")
    folded: list[int] = []
    add = transcript_pages.Fold.add
    monkeypatch.setattr(transcript_pages.Fold, "add", lambda fold, ev: folded.append(1) or add(fold, ev))

    newest = api.get(f"/sessions/{session.pk}/fragment").content.decode()
    named = api.get(f"/sessions/{session.pk}/fragment?runs={huge.pk},{newer.pk}").content.decode()
    single = api.get(f"/sessions/{session.pk}/runs/{huge.pk}/fragment").content.decode()

    too_large = f'<section class="turn-fragment" data-run="{huge.pk}" data-too-large></section>'
    small = f'<section class="turn-fragment" data-run="{newer.pk}" data-last-seq'
    assert newest.startswith(small) and str(huge.pk) not in re.findall(r'data-run="(\d+)"', newest)
    assert named.startswith(too_large) and small in named and single == too_large
    assert len(folded) == 2 * newer.last_seq  # only the small turn's events were read, twice
    cut = transcript(api, session, limit=1, before=newer.pk)["turns"][0]  # the transcript still cuts it
    assert cut["run_id"] == huge.pk and cut["complete"] is False and cut["state"]["last_seq"] > 0


# ---------------------------------------------------------------- the export


@pytest.fixture
def long_session(session: Any) -> Any:
    for n in range(40):
        settled(session, f"{n} " + "w" * 100 * KIB, prompt_text=f"question {n}")
    return session


def consume_peak(response: Any) -> tuple[int, int, bytes, bytes]:
    """Read the streamed body chunk by chunk, keeping none: its size, the most memory Python held
    at once meanwhile, and its first and last chunks."""
    size, first, last = 0, b"", b""
    tracemalloc.start()
    try:
        for chunk in response.streaming_content:
            size += len(chunk)
            first, last = first or chunk[:200], chunk[-200:]
        return size, tracemalloc.get_traced_memory()[1], first, last
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("fmt", ["json", "markdown"])
def test_the_export_streams_a_run_at_a_time(api: Client, long_session: Any, fmt: str) -> None:
    response = api.get(f"/api/sessions/{long_session.pk}/export?format={fmt}")

    assert response.streaming
    size, peak, first, last = consume_peak(response)

    assert size > 4_000 * KIB
    assert peak < size / 2  # a run's worth at a time, never the whole session
    if fmt == "json":
        assert first.startswith(b'{\n  "session": {') and last.endswith(b'"intents": []\n}\n')
    else:
        assert first.startswith(b"# ") and last.endswith(b"w\n")


def test_the_json_export_is_the_same_document_as_before(api: Client, session: Any) -> None:
    from runs.export import session_json

    settled(session, "Hi\nthere", prompt_text="multi\nline")
    factories.PendingIntentFactory(session=session, text="next")

    streamed = api.get(f"/api/sessions/{session.pk}/export?format=json").getvalue()

    expected = orjson.dumps(session_json(session), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
    assert streamed.rstrip() == expected


@pytest.mark.embedded
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("layer", ["embedded"], indirect=True)
def test_daphne_serves_the_streamed_export(live: LiveStack) -> None:
    session = factories.SessionFactory()
    for n in range(3):
        settled(session, f"answer {n}", prompt_text=f"question {n}")
    _, token = factories.ApiToken.issue(session.project.owner, name="tests")
    live.start_daphne()
    conn = http.client.HTTPConnection("127.0.0.1", live.port, timeout=30)

    conn.request(
        "GET", f"/api/sessions/{session.pk}/export?format=json", headers={"Authorization": f"Bearer {token}"}
    )
    response = conn.getresponse()

    assert response.status == 200
    assert response.getheader("Content-Length") is None  # sent as it is made, not assembled first
    data = orjson.loads(response.read())
    assert [t["state"]["text"] for t in data["turns"]] == ["answer 0", "answer 1", "answer 2"]


def test_under_asgi_the_export_is_an_async_stream(session: Any) -> None:
    """Django's ASGI handler gathers a synchronous generator into one list before sending it."""
    from django.test import AsyncRequestFactory

    from runs.api import export_session

    settled(session, "Hi")
    request = AsyncRequestFactory().get(f"/api/sessions/{session.pk}/export")
    request.auth = session.project.owner

    response = export_session(request, session.pk, format="json")

    assert response.streaming and response.is_async
