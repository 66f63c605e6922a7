"""The sidebar redraws under the user (every session's live state arrives as `sessions` frames)
without taking their click or their focus.

A click is a press and a release on one element: a redraw between the two replaced the element
and the click was lost (a ⚙ that did nothing, seen once in CI). Renders now wait for the
release; a redraw moves the focus to the new copy of the focused control. Design note: docs/ui.md.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest

from runs import services
from tests import factories
from tests.support.browser import Workbench, browser, open_session, screenshots, workbench  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]


class Opened(NamedTuple):
    page: Any
    here: Any  # the session the page shows
    background: Any  # another session of the same project, whose turn asks for an approval


@pytest.fixture
def opened(workbench: Workbench, user: Any) -> Opened:
    project = factories.ProjectFactory(owner=user, name="Demo project")
    here = factories.SessionFactory(project=project, title="Open here")
    background = factories.SessionFactory(project=project, title="Background work")
    page = workbench.new_page()
    open_session(page, here.pk)
    return Opened(page, here, background)


def needs_you(page: Any, session: Any) -> Any:
    return page.locator(f".session[data-session-id='{session.pk}'] .live-state.needs-you")


def background_asks(page: Any, background: Any) -> None:
    """A background turn asks for an approval; returns once the page has taken its `sessions`
    frame (the tab's title counts it in the same step that asks the sidebar to redraw)."""
    services.do_submit_message(background, client_id="bg-1", text="approve this write")
    page.wait_for_function("() => document.title.startsWith('(1) ')")


def test_a_click_whose_press_and_release_straddle_a_redraw_still_clicks(opened: Opened) -> None:
    page, background = opened.page, opened.background
    page.get_by_role("button", name="Edit project Demo project").hover()  # the pointer on its centre
    page.mouse.down()
    background_asks(page, background)
    # Held while the button is pressed: the element under the pointer is still the one pressed.
    assert needs_you(page, background).count() == 0
    page.mouse.up()
    dialog = page.get_by_role("dialog", name="Project “Demo project”")
    dialog.wait_for()
    # Released, the held redraw follows.
    needs_you(page, background).wait_for()
    dialog.get_by_role("button", name="Cancel").click()
    dialog.wait_for(state="detached")


def test_a_redraw_keeps_the_focus_and_a_held_space_key(opened: Opened) -> None:
    page, here, background = opened
    page.locator(f".session[data-session-id='{background.pk}'] [data-action='archive']").focus()
    background_asks(page, background)
    needs_you(page, background).wait_for()
    # The list was drawn again, and the focus is on the new copy of the same control.
    focused = page.evaluate(
        "() => { const el = document.activeElement;"
        " return [el.dataset.action, el.closest('[data-session-id]')?.dataset.sessionId, el.isConnected]; }"
    )
    assert focused == ["archive", str(background.pk), True]

    # Space clicks a button on its release: a redraw between press and release waits as well.
    page.get_by_role("button", name="Edit project Demo project").focus()
    page.keyboard.down(" ")
    services.do_submit_message(here, client_id="here-1", text="approve this write")
    page.wait_for_function("() => document.title.startsWith('(2) ')")
    assert needs_you(page, here).count() == 0
    page.keyboard.up(" ")
    page.get_by_role("dialog", name="Project “Demo project”").wait_for()
    needs_you(page, here).wait_for()
