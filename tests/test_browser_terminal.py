"""A live ACP terminal in its tool card: output as it arrives, ANSI colours drawn, no raw escapes.

Issue 44 ("The client side of ACP"). The demo agent's `terminal` word has the runner run a
command in the agent's sandbox (runs/runner/terminals.py); its `terminal.output` events fill the
tool card that refers to the terminal (static/js/terminal.js, static/js/ansi.js). The command
waits for a file the test creates, so the live card is seen (and photographed) before it ends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests import factories
from tests.support.browser import (  # noqa: F401 - fixtures
    Workbench,
    browser,
    open_session,
    screenshots,
    send,
    turn,
    wait_settled,
    workbench,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

COMMAND = (
    "terminal printf '\\033[1;32mPASS\\033[0m tests/test_a.py <b>not bold</b>\\n"
    "\\033[31mFAIL\\033[0m tests/test_b.py\\n\\033]0;a title\\007\\033[2Kprogress 10%%\\rprogress 100%%\\n'; "
    "while [ ! -e go ]; do sleep 0.05; done; printf '\\033[33mdone\\033[0m\\n'"
)


@pytest.fixture
def session(user: Any) -> Any:
    project = factories.ProjectFactory(owner=user, name="Demo project")
    return factories.SessionFactory(project=project, title="")


def test_a_live_terminal_card_shows_colours_and_no_escapes(workbench: Workbench, session: Any) -> None:
    page = workbench.new_page(viewport={"width": 1200, "height": 760})
    open_session(page, session.pk)
    send(page, COMMAND)
    screen = turn(page).locator(".tool-card[data-tool-kind='execute'] .terminal-screen")
    passed = screen.locator("span.ansi-fg-2.ansi-bold", has_text="PASS")
    passed.wait_for()
    # Live: the command still waits for `go`, the card already shows what it printed.
    assert turn(page).get_attribute("data-status") != "completed"
    assert screen.locator("span.ansi-fg-1", has_text="FAIL").count() == 1
    text = screen.inner_text()
    assert "\x1b" not in text and "[0m" not in text and "a title" not in text
    assert "progress 100%" in text and "progress 10%" not in text  # a carriage return rewrites its line
    assert "<b>not bold</b>" in text and screen.locator("b").count() == 0  # text, never HTML

    workbench.screenshot(page, "terminal-live-light")
    dark = workbench.new_page(viewport={"width": 1200, "height": 760}, color_scheme="dark")
    open_session(dark, session.pk)
    dark.locator(".terminal-screen span.ansi-fg-2", has_text="PASS").wait_for()
    workbench.screenshot(dark, "terminal-live-dark")
    phone = workbench.new_page(viewport={"width": 420, "height": 860})
    open_session(phone, session.pk)
    phone.locator(".terminal-screen span.ansi-fg-2", has_text="PASS").wait_for()
    card = phone.locator(".tool-card[data-tool-kind='execute']")
    assert card.evaluate("(el) => el.scrollWidth <= el.clientWidth + 1")  # no sideways scroll on a phone
    card.scroll_into_view_if_needed()
    workbench.screenshot(phone, "terminal-live-phone")

    (Path(session.project.path) / "go").write_text("")
    settled = wait_settled(page, 1)
    done = settled.locator(".terminal-screen span.ansi-fg-3", has_text="done")
    done.wait_for()
    assert settled.locator(".tool-card[data-tool-kind='execute']").get_attribute("data-status") == "completed"

    # From the transcript after a reload, the same terminal.
    page.reload()
    page.wait_for_selector("#workbench[data-ready='true']")
    again = turn(page).locator(".terminal-screen")
    again.locator("span.ansi-fg-3", has_text="done").wait_for()
    assert again.locator("span.ansi-fg-2.ansi-bold", has_text="PASS").count() == 1
