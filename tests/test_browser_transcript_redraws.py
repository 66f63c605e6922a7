"""A transcript item drawn again under the user (a tool's output streaming) keeps their click
and their focus.

A tool card is drawn again whole whenever its own events change it. A click on its Output fold
whose press and release straddle one of those redraws was lost: the summary pressed was no longer
there on release. The redraw now waits for the release (static/js/dom.js `heldWhilePressed`), and
a redraw moves the focus to the new copy of the focused fold. Design note: docs/ui.md.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest

from runs import journal
from runs.journal import NewEvent
from runs.models import Run, RunStatus
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

OUTPUT_OPEN = "() => document.querySelector('.tool-card details.tool-output')?.open === true"


class Streaming(NamedTuple):
    page: Any
    run: Run


@pytest.fixture
def streaming(workbench: Workbench, user: Any) -> Streaming:
    """A turn whose tool is running, its output so far on the card (folded), open in a page."""
    session = factories.SessionFactory(project=factories.ProjectFactory(owner=user), title="Tests")
    run = factories.RunFactory(
        session=session, prompt_text="Run the tests", status=RunStatus.RUNNING, **fixture_lease()
    )
    journal.append_batch(
        run.pk,
        [
            NewEvent("run.started", {"status": "running"}),
            NewEvent("tool.started", {"tool_call_id": "t1", "title": "pytest", "tool_kind": "execute"}),
            NewEvent("tool.updated", {"tool_call_id": "t1", "status": "in_progress", "output": "line 1"}),
        ],
    )
    page = workbench.new_page()
    open_session(page, session.pk)
    page.locator(".tool-card details.tool-output > summary").wait_for()
    return Streaming(page, run)


def more_output(page: Any, run: Run, n: int) -> None:
    """The tool's output grows, and the turn's text too; returns once the page has the text
    (the card's redraw may be held, the text is drawn in place)."""
    lines = "\n".join(f"line {i}" for i in range(1, n + 1))
    journal.append_batch(
        run.pk,
        [
            NewEvent("tool.updated", {"tool_call_id": "t1", "status": "in_progress", "output": lines}),
            NewEvent("token.delta", {"message_id": f"m{n}", "delta": f"Still running ({n})."}),
        ],
    )
    page.get_by_text(f"Still running ({n}).").wait_for()


def test_a_click_on_a_streaming_tools_fold_is_not_lost_to_its_redraw(
    streaming: Streaming, workbench: Workbench, screenshots: Any
) -> None:
    page, run = streaming
    summary = page.locator(".tool-card details.tool-output > summary")
    assert not page.evaluate(OUTPUT_OPEN)
    summary.hover()
    page.mouse.down()
    more_output(page, run, 2)
    # Held while pressed: the summary under the pointer is still the one pressed.
    assert "line 2" not in page.locator(".tool-card").inner_text()
    page.mouse.up()
    page.wait_for_function(OUTPUT_OPEN)
    # Released, the held redraw follows, and keeps the fold the click opened.
    page.locator(".tool-card details.tool-output").get_by_text("line 2").wait_for()
    assert page.evaluate(OUTPUT_OPEN)
    page.screenshot(path=str(screenshots / "tool-output-opened-while-streaming.png"))
    page.emulate_media(color_scheme="dark")
    page.screenshot(path=str(screenshots / "tool-output-opened-while-streaming-dark.png"))
    phone = workbench.new_page(viewport={"width": 420, "height": 860})
    open_session(phone, run.session_id)
    phone.locator(".tool-card details.tool-output > summary").click()
    phone.wait_for_function(OUTPUT_OPEN)
    phone.screenshot(path=str(screenshots / "tool-output-opened-while-streaming-phone.png"))


def test_a_redraw_keeps_the_focus_on_the_fold(streaming: Streaming) -> None:
    page, run = streaming
    page.locator(".tool-card details.tool-output > summary").focus()
    more_output(page, run, 3)
    page.locator(".tool-card").get_by_text("line 3").wait_for(state="attached")
    focused = page.evaluate(
        "() => { const el = document.activeElement;"
        " return [el.tagName, el.closest('details')?.className, el.isConnected]; }"
    )
    assert focused == ["SUMMARY", "tool-output", True]
    # The keyboard opens it, on the new copy.
    page.keyboard.press("Enter")
    page.wait_for_function(OUTPUT_OPEN)
