"""Helpers for tests that drive real runs: submit, wait for states, read journals."""

from __future__ import annotations

import uuid
from typing import Any, NamedTuple

from projects.models import Session
from runs import journal
from runs.models import JournalEvent, Run
from runs.services import SubmitResult, do_submit_message
from runs.transcript import materialize
from tests.support.procs import wait_for


def submit(session: Session, text: str, mode: str = "auto") -> SubmitResult:
    return do_submit_message(session, client_id=uuid.uuid4().hex, text=text, mode=mode)


def run_of(result: SubmitResult) -> Run:
    assert result.run is not None, result
    return result.run


def refreshed(run: Run) -> Run:
    run.refresh_from_db()
    return run


def wait_status(run: Run, *statuses: str, timeout: float = 30.0, log: Any = None) -> Run:
    def check() -> bool:
        return refreshed(run).status in statuses

    try:
        wait_for(check, timeout, what=f"run {run.pk} to reach {statuses}")
    except AssertionError as exc:
        if log is not None:
            print(log())
        raise AssertionError(f"{exc}; it is {refreshed(run).status}") from None
    return run


def wait_event(run: Run, type: str, timeout: float = 30.0, **payload: Any) -> JournalEvent:
    def find() -> JournalEvent | None:
        for event in JournalEvent.objects.filter(run=run, type=type).order_by("seq"):
            if all(event.payload.get(k) == v for k, v in payload.items()):
                return event
        return None

    return wait_for(find, timeout, what=f"{type} {payload or ''} on run {run.pk}")


def events(run: Run) -> list[JournalEvent]:
    return list(JournalEvent.objects.filter(run=run).order_by("seq"))


def types(run: Run) -> list[str]:
    return [e.type for e in events(run)]


def state(run: Run) -> dict[str, Any]:
    return materialize(events(run))


def assert_journal_well_formed(run: Run) -> None:
    """seq is 1..N without gaps, exactly one terminal event and it is the last."""
    evs = events(run)
    assert [e.seq for e in evs] == list(range(1, len(evs) + 1))
    terminals = [e for e in evs if e.terminal]
    assert len(terminals) == 1 and terminals[0] is evs[-1], [e.type for e in evs]
    assert evs[-1].type == "done"
    assert refreshed(run).last_seq == len(evs)


def append_event(
    run_id: int, type: str, payload: dict[str, Any] | None = None, **run_updates: Any
) -> JournalEvent:
    """One event appended as the web's domain actions append (journal.append_batch)."""
    return journal.append_batch(run_id, [journal.NewEvent(type, payload or {})], **run_updates)[0]


class EventsPageRead(NamedTuple):
    events: list[dict[str, Any]]
    link: str | None  # the answer's `Link: <…>; rel="next"`, if it had one


def follow_event_pages(client: Any, url: str) -> list[EventsPageRead]:
    """Every page of a run's events from `url` on, following each answer's next link."""
    pages: list[EventsPageRead] = []
    next_url: str | None = url
    while next_url is not None:
        response = client.get(next_url)
        assert response.status_code == 200, response.content
        link = response.headers.get("Link")
        pages.append(EventsPageRead(response.json()["events"], link))
        next_url = link.removeprefix("<").split(">;")[0] if link else None
    return pages
