"""Turn actions and the key map: retry, copy, edit-and-send, previous/next turn; Esc, digits, /, j, k, ?.

Keys never act while the user types in a field (Esc only from an empty message box).
"""

from __future__ import annotations

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

CLIPBOARD = ["clipboard-read", "clipboard-write"]
# Every fetch the page makes, recorded as it is made (not when Playwright hears of it).
RECORD_FETCHES = """
window.__fetches = [];
const realFetch = window.fetch;
window.fetch = (input, init) => {
  window.__fetches.push(`${(init && init.method) || 'GET'} ${typeof input === 'string' ? input : input.url}`);
  return realFetch(input, init);
};
"""


@pytest.fixture
def session(user: Any) -> Any:
    project = factories.ProjectFactory(owner=user, name="Demo project")
    return factories.SessionFactory(project=project, title="")


def clipboard(page: Any) -> str:
    return page.evaluate("navigator.clipboard.readText()")


def blur(page: Any) -> None:
    page.evaluate("document.activeElement && document.activeElement.blur()")


def active_run_id(page: Any) -> str | None:
    return page.evaluate("document.activeElement.closest('article.turn')?.dataset.runId ?? null")


def test_retry_copy_and_edit_a_turn(workbench: Workbench, session: Any) -> None:
    page = workbench.new_page(permissions=CLIPBOARD)
    open_session(page, session.pk)
    send(page, "hello fast")
    first = wait_settled(page, 1)

    first.get_by_role("button", name="Copy prompt").click()
    page.wait_for_function("async () => (await navigator.clipboard.readText()) === 'hello fast'")
    first.get_by_role("button", name="Copy python code").click()
    page.wait_for_function(
        "async () => (await navigator.clipboard.readText()).startsWith('def count_words(')"
    )
    assert clipboard(page).endswith("assert count_words(prompt) == 2\n")
    first.get_by_role("button", name="Copy answer").click()
    page.wait_for_function("async () => (await navigator.clipboard.readText()).startsWith('## Demo answer')")
    assert "> hello fast" in clipboard(page)

    # Retry: the same prompt again, as a new turn with a client id of its own.
    first.get_by_role("button", name="Retry: send this prompt again").click()
    second = wait_settled(page, 2)
    assert second.locator(".user-text").inner_text() == "hello fast"
    client_ids = list(session.runs.values_list("client_id", flat=True))
    assert len(client_ids) == 2 and len(set(client_ids)) == 2

    # Edit: the prompt goes into the composer, focused, for changing before sending.
    first.get_by_role("button", name="Edit prompt in the composer").click()
    box = page.get_by_role("textbox", name="Message")
    assert box.input_value() == "hello fast"
    assert page.evaluate("document.activeElement === document.querySelector('.composer textarea')")
    box.press("End")
    box.type(" and more")
    box.press("Enter")
    third = wait_settled(page, 3)
    assert third.locator(".user-text").inner_text() == "hello fast and more"


def test_the_key_map(workbench: Workbench, session: Any) -> None:
    page = workbench.new_page(viewport={"width": 1200, "height": 760})
    page.add_init_script(RECORD_FETCHES)
    open_session(page, session.pk)
    for count, prompt in enumerate(["hello fast", "think fast", "tool fast"], start=1):
        send(page, prompt)
        wait_settled(page, count)
    runs = page.evaluate("[...document.querySelectorAll('article.turn')].map((t) => t.dataset.runId)")

    # While typing, the keys are text.
    box = page.get_by_role("textbox", name="Message")
    box.click()
    box.type("jk/?12")
    assert box.input_value() == "jk/?12"
    assert page.locator("dialog[open]").count() == 0
    box.fill("")

    # k / j: previous and next turn, from where the reader is (at the bottom: the last turn).
    blur(page)
    page.keyboard.press("k")
    assert active_run_id(page) == runs[2]
    page.keyboard.press("k")
    assert active_run_id(page) == runs[1]
    page.keyboard.press("k")
    assert active_run_id(page) == runs[0]
    page.keyboard.press("j")
    assert active_run_id(page) == runs[1]
    page.get_by_role("button", name="Previous turn").click()
    assert active_run_id(page) == runs[0]
    page.get_by_role("button", name="Next turn").click()
    assert active_run_id(page) == runs[1]

    # /: the message box, without typing the slash.
    page.keyboard.press("/")
    assert page.evaluate("document.activeElement === document.querySelector('.composer textarea')")
    assert box.input_value() == ""

    # ?: the key map, an accessible dialog; Esc closes it.
    blur(page)
    page.keyboard.press("?")
    dialog = page.get_by_role("dialog", name="Keyboard shortcuts")
    dialog.wait_for()
    assert dialog.get_by_role("row").count() >= 8
    assert "Stop the running turn" in dialog.inner_text()
    workbench.docs_screenshot(page, "keymap")
    page.keyboard.press("Escape")
    dialog.wait_for(state="detached")
    page.get_by_role("button", name="Keyboard shortcuts").click()
    page.get_by_role("dialog", name="Keyboard shortcuts").get_by_role("button", name="Close").click()
    page.get_by_role("dialog", name="Keyboard shortcuts").wait_for(state="detached")

    # Digits answer the open approval: 3 is its third option (Deny).
    send(page, "approve fast")
    card = page.locator(".approval-card[data-state='pending']")
    card.wait_for()
    assert card.get_by_role("button", name="Deny", exact=True).get_attribute("aria-keyshortcuts") == "3"
    blur(page)
    page.keyboard.press("3")
    settled = wait_settled(page, 4)
    assert "Answered: Deny" in settled.locator(".approval-card").inner_text()

    # Esc stops the running turn — but not while the message box holds a draft.
    send(page, "hold")  # held until Esc cancels it, so the draft check cannot race its end
    page.wait_for_selector("article.turn[data-status='running']")
    box.fill("a draft")
    box.press("Escape")
    assert not [f for f in page.evaluate("window.__fetches") if f.endswith("/cancel")]
    assert page.locator("article.turn[data-status='running']").count() == 1
    blur(page)
    page.keyboard.press("Escape")
    wait_settled(page, 5, "cancelled")
    assert box.input_value() == "a draft"
    assert [f for f in page.evaluate("window.__fetches") if f.endswith("/cancel")]
