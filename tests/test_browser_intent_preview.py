"""A long queued message in the browser: listed as a preview, edited whole.

The intents list (GET /api/sessions/{id}/intents, read after every submit and action) and the
socket's snapshot carry the first characters and the length; Edit reads the whole text.
"""

from __future__ import annotations

from typing import Any

import pytest

from intents.previews import INTENT_PREVIEW_CHARS
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
from tests.support.hold import release

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

LONG = "A long queued message. " * 300 + "The end."


@pytest.fixture
def session(user: Any) -> Any:
    project = factories.ProjectFactory(owner=user, name="Demo project")
    return factories.SessionFactory(project=project, title="")


def test_a_long_queued_message_is_listed_as_a_preview_and_edited_whole(
    workbench: Workbench, session: Any
) -> None:
    page = workbench.new_page()
    lists: list[Any] = []
    page.on(
        "response", lambda r: lists.append(r) if r.url.endswith(f"/sessions/{session.pk}/intents") else None
    )
    open_session(page, session.pk)
    send(page, "hold")  # a turn that stays open: what follows is queued behind it
    page.wait_for_function(
        "() => document.querySelector('article.turn')?.textContent.includes('Held chunk 1.')"
    )

    # The submit's answer makes the browser read the list; the socket's snapshot may draw the
    # card first, so the read is waited for, not assumed done once the card is there.
    with page.expect_response(lambda r: r.url.endswith(f"/sessions/{session.pk}/intents")):
        send(page, LONG)
    card = page.locator(".intent-card[data-kind='queue']")
    card.locator(".intent-text", has_text=f"({len(LONG):,} characters)").wait_for()
    assert LONG[:INTENT_PREVIEW_CHARS] in card.locator(".intent-text").inner_text()
    assert "The end." not in card.locator(".intent-text").inner_text()
    # Every list the browser read (after the submit) carried the preview, not the text.
    assert lists, "the browser never read the intents list"
    assert all(
        len(i["text"]) <= INTENT_PREVIEW_CHARS for response in lists for i in response.json()["intents"]
    )

    card.get_by_role("button", name="Edit").click()
    editor = page.locator(".intent-card textarea.intent-edit")
    editor.wait_for()
    assert editor.input_value() == LONG
    editor.fill(LONG.replace("The end.", "The new end."))
    editor.press("Enter")
    card.locator(".intent-text", has_text=f"({len(LONG) + 4:,} characters)").wait_for()
    intent = session.intents.get()
    assert intent.text.endswith("The new end.") and len(intent.text) == len(LONG) + 4

    release(session.project.path)
    wait_settled(page, 2)
    assert turn(page).locator(".user-text").inner_text().endswith("The new end.")


def test_a_long_queued_message_read_from_the_transcript_is_a_preview_and_edited_whole(
    workbench: Workbench, session: Any
) -> None:
    whole = "Queued and read back after a reload. " * 1_360 + "The end."
    assert len(whole) >= 50_000
    page = workbench.new_page()
    open_session(page, session.pk)
    send(page, "hold")
    page.wait_for_function(
        "() => document.querySelector('article.turn')?.textContent.includes('Held chunk 1.')"
    )
    send(page, whole)
    page.locator(".intent-card[data-kind='queue']").wait_for()

    # A reload draws the queue from the transcript's `intents`, which carry the preview.
    with page.expect_response(lambda r: f"/sessions/{session.pk}/transcript" in r.url) as answer:
        page.reload()
    transcript = answer.value.json()
    [listed] = transcript["intents"]
    assert (listed["text"], listed["text_length"], listed["truncated"]) == (
        whole[:INTENT_PREVIEW_CHARS],
        len(whole),
        True,
    )
    card = page.locator(".intent-card[data-kind='queue']")
    card.locator(".intent-text", has_text=f"({len(whole):,} characters)").wait_for()
    assert "The end." not in card.locator(".intent-text").inner_text()

    card.get_by_role("button", name="Edit").click()
    editor = page.locator(".intent-card textarea.intent-edit")
    editor.wait_for()
    assert editor.input_value() == whole

    # Withdrawn, so the test does not wait for the demo agent's answer to 50,000 characters.
    editor.press("Escape")
    card.get_by_role("button", name="Delete").click()
    card.wait_for(state="detached")
    release(session.project.path)
    wait_settled(page, 1)
