"""A finished turn larger than a transcript page, in a real browser (issue 25, the long page).

When one of its items is larger than the page on its own, its page comes from its start, cut
(`complete` false), and the socket replays the rest, thousands of events a
frame. The page applies them all but draws the turn when its end has come (or once a second
until then), not on every frame of the replay: each draw lays out the whole long turn. It must
end showing exactly the journal's text, nothing lost and nothing twice.
"""

from __future__ import annotations

from typing import Any

import pytest

from runs import journal
from runs.journal import NewEvent, done_event
from runs.models import Run, RunStatus
from runs.transcript import materialize
from runs.turns import finish_run
from tests import factories
from tests.support.browser import (  # noqa: F401 - fixtures
    Workbench,
    browser,
    fixture_lease,
    open_session,
    screenshots,
    workbench,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

PAGE_BYTES = 64 * 1024
EVENTS = 30_000
# Draws of the turn's items in the document (mutation batches inside `.items`; the turn's first
# draw is made before it is attached), with the first and last one's time.
DRAWS = """
window.__draws = { count: 0, first: null, last: null };
new MutationObserver((records) => {
  const inItems = (r) => (r.target.nodeType === 1 ? r.target : r.target.parentElement)?.closest('.items');
  if (!records.some(inItems)) return;
  const now = performance.now();
  window.__draws.count += 1;
  window.__draws.first ??= now;
  window.__draws.last = now;
}).observe(document, { childList: true, subtree: true });
"""
SHOWN = """() => [...document.querySelectorAll('article.turn .item-text')]
  .map((node) => node.textContent).join(' ').replace(/\\s+/g, ' ').trim()"""


def long_finished_run(session: Any) -> Run:
    """A turn like the bench's (token deltas, a tool update every 20th), each delta told apart, in
    one message with no tool card between: one item larger than a page, so the page cannot come
    from the run's end (tests/test_browser_transcript_tail.py) and comes from its start."""
    run = factories.RunFactory(
        session=session, prompt_text="Go long", status=RunStatus.RUNNING, **fixture_lease()
    )
    events = [NewEvent("run.started", {"status": "running"})]
    for i in range(EVENTS):
        if i % 20 == 19:
            events.append(NewEvent("progress", {"text": f"step {i // 100}"}))
        else:
            events.append(NewEvent("token.delta", {"message_id": "msg", "delta": f"w{i} "}))
    journal.append_batch(run.pk, events, publish=False)
    finish_run(run.pk, [done_event(RunStatus.COMPLETED, stop_reason="end_turn")])
    run.refresh_from_db()
    return run


def small_pages(workbench: Workbench) -> None:
    """daphne again, with transcript pages of PAGE_BYTES: the run passes one several times."""
    workbench.restart_daphne(HERMESWEB_TRANSCRIPT_PAGE_BYTES=str(PAGE_BYTES))


def test_a_finished_turn_cut_at_the_page_budget_is_drawn_once_caught_up_with_the_journals_text(
    workbench: Workbench, user: Any
) -> None:
    session = factories.SessionFactory(project=factories.ProjectFactory(owner=user), title="Long turn")
    run = long_finished_run(session)
    small_pages(workbench)
    page = workbench.new_page()
    page.add_init_script(DRAWS)

    open_session(page, session.pk)
    page.wait_for_selector("article.turn[data-status='completed'][data-rendered='plain']")

    first = page.evaluate(f"() => fetch('/api/sessions/{session.pk}/transcript').then((r) => r.json())")
    [turn] = first["turns"]
    assert turn["complete"] is False and turn["state"]["last_seq"] < run.last_seq / 2  # most of it replayed
    draws = page.evaluate("window.__draws")
    seconds = (draws["last"] - draws["first"]) / 1000
    # One when the end came and one a second before that: not one a frame (the replay is dozens).
    assert draws["count"] <= 2 + seconds, draws
    text = " ".join(
        item["text"] for item in materialize(run.events.order_by("seq"))["items"] if item["kind"] == "text"
    )
    assert page.evaluate(SHOWN) == " ".join(text.split())
