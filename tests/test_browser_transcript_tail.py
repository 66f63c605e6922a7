"""A finished turn larger than a transcript page opens at its end, in a real browser (issue 25).

The page holds the run's last items (`items_from` says how many came before); the turn is
settled at once, with no replay to wait for. "Show earlier parts of this answer" reads the rest
back a page at a time and puts it above without moving what the reader sees; Copy copies the
whole answer. Read all the way back, it shows exactly the journal's text: nothing lost, nothing twice.
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

PAGE_BYTES = 16 * 1024
PARTS = 120
SHOWN = """() => [...document.querySelectorAll('article.turn .item-text')]
  .map((node) => node.textContent).join(' ').replace(/\\s+/g, ' ').trim()"""


def long_finished_run(session: Any) -> Run:
    """Text between tool cards, each part told apart: about six pages' worth."""
    run = factories.RunFactory(
        session=session, prompt_text="Go long", status=RunStatus.RUNNING, **fixture_lease()
    )
    events = [NewEvent("run.started", {"status": "running"})]
    for n in range(PARTS):
        events.append(
            NewEvent("token.delta", {"message_id": f"m{n}", "delta": f"Part {n}: " + "lorem ipsum " * 60})
        )
        events.append(
            NewEvent("tool.started", {"tool_call_id": f"t{n}", "title": f"Read file {n}", "kind": "read"})
        )
        events.append(
            NewEvent("tool.done", {"tool_call_id": f"t{n}", "status": "completed", "output": f"ok {n}"})
        )
    events.append(NewEvent("token.delta", {"message_id": "last", "delta": "The end."}))
    journal.append_batch(run.pk, events, publish=False)
    finish_run(run.pk, [done_event(RunStatus.COMPLETED, stop_reason="end_turn")])
    run.refresh_from_db()
    return run


def small_pages(workbench: Workbench) -> None:
    """daphne again, with transcript pages of PAGE_BYTES: the run passes one several times."""
    workbench.restart_daphne(HERMESWEB_TRANSCRIPT_PAGE_BYTES=str(PAGE_BYTES))


def journal_text(run: Run) -> str:
    items = materialize(run.events.order_by("seq"))["items"]
    return " ".join(" ".join(item["text"] for item in items if item["kind"] == "text").split())


def test_a_long_finished_turn_opens_at_its_end_and_reads_back_to_exactly_the_journals_text(
    workbench: Workbench, user: Any, screenshots: Any
) -> None:
    session = factories.SessionFactory(project=factories.ProjectFactory(owner=user), title="Long turn")
    run = long_finished_run(session)
    small_pages(workbench)
    page = workbench.new_page()
    # Every frame the socket brings: a turn from its end has nothing to replay.
    page.add_init_script(
        "window.__frames = 0; window.WebSocket = class extends window.WebSocket {"
        " constructor(...a) { super(...a); this.addEventListener('message', (e) => {"
        " if (JSON.parse(e.data).type === 'event') window.__frames += 1; }); } };"
    )

    open_session(page, session.pk)
    page.wait_for_selector("article.turn[data-status='completed'][data-rendered='plain']")
    button = page.locator(".turn-earlier button")
    assert "earlier parts of this answer" in button.inner_text()
    shown = page.evaluate(SHOWN)
    whole = journal_text(run)
    assert shown.endswith("The end.") and whole.endswith(shown) and len(shown) < len(whole) / 2
    page.screenshot(path=str(screenshots / "transcript-tail-end.png"))

    # The reader's place stays put while earlier parts come above it.
    anchor = page.locator("article.turn .item-text").first.element_handle()
    anchor.scroll_into_view_if_needed()
    top = anchor.bounding_box()["y"]
    button.click()
    page.wait_for_function("() => !document.querySelector('.turn-earlier button[aria-busy=true]')")
    assert abs(anchor.bounding_box()["y"] - top) < 2
    assert len(page.evaluate(SHOWN)) > len(shown)

    while button.is_visible():
        button.click()
        page.wait_for_function("() => !document.querySelector('.turn-earlier button[aria-busy=true]')")
    assert page.evaluate(SHOWN) == whole
    # The last click took the button away: keyboard focus stayed in the turn.
    assert page.evaluate("document.activeElement.matches('article.turn')")
    assert page.get_by_role("status").filter(has_text="The whole answer is shown.").count() == 1
    indexes = page.evaluate(
        "() => [...document.querySelectorAll('article.turn .item')].map((n) => Number(n.dataset.item))"
    )
    assert indexes == list(range(len(indexes)))  # each item once, in the run's order
    assert page.evaluate("window.__frames") == 0


def test_copy_answer_copies_the_whole_answer_of_a_turn_that_came_from_its_end(
    workbench: Workbench, user: Any
) -> None:
    session = factories.SessionFactory(project=factories.ProjectFactory(owner=user), title="Long turn")
    run = long_finished_run(session)
    small_pages(workbench)
    page = workbench.new_page(permissions=["clipboard-read", "clipboard-write"])

    open_session(page, session.pk)
    page.wait_for_selector("article.turn[data-status='completed'][data-rendered='plain']")
    page.get_by_role("button", name="Copy answer").click()
    page.wait_for_selector("[data-action=copy-answer]:text('Copied')")

    copied = page.evaluate("() => navigator.clipboard.readText()")
    items = materialize(run.events.order_by("seq"))["items"]
    assert copied == "\n\n".join(item["text"].strip() for item in items if item["kind"] == "text")
