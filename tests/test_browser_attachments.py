"""Attachments in the browser: the attach button, paste and drop, removable thumbnails in the
composer, and the user's turn showing what it sent, live and after a reload (demo agent)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from runs.models import Run
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
from tests.support.images import png

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

DOT = png(24, 24, (230, 120, 20))
PHONE = {"width": 420, "height": 860}


@pytest.fixture
def session(user: Any) -> Any:
    project = factories.ProjectFactory(owner=user, name="Demo project")
    return factories.SessionFactory(project=project, title="")


def composer_chip(page: Any, name: str) -> Any:
    return page.locator(".composer-attachments .attachment").filter(has_text=name)


def wait_thumbnail_loaded(scope: Any, name: str) -> None:
    image = scope.get_by_role("img", name=name)
    image.wait_for()
    image.evaluate("img => img.complete || new Promise(r => img.addEventListener('load', r, { once: true }))")
    assert image.evaluate("img => img.naturalWidth") == 24


def hand_over(page: Any, event: str, name: str, data: bytes, mime: str) -> None:
    """Paste into the message box, or drop on the composer, a file built in the page."""
    page.evaluate(
        """([event, name, encoded, mime]) => {
            const bytes = Uint8Array.from(atob(encoded), (c) => c.charCodeAt(0));
            const transfer = new DataTransfer();
            const init = { bubbles: true, cancelable: true };
            transfer.items.add(new File([bytes], name, { type: mime }));
            if (event === 'paste') {
                const box = document.querySelector('.composer textarea');
                box.dispatchEvent(new ClipboardEvent('paste', { ...init, clipboardData: transfer }));
            } else {
                const composer = document.querySelector('.composer');
                composer.dispatchEvent(new DragEvent('dragover', { ...init, dataTransfer: transfer }));
                composer.dispatchEvent(new DragEvent('drop', { ...init, dataTransfer: transfer }));
            }
        }""",
        [event, name, base64.b64encode(data).decode(), mime],
    )


def test_an_attached_image_shows_in_the_composer_then_in_the_sent_turn_and_after_reload(
    workbench: Workbench, session: Any, tmp_path: Path
) -> None:
    (tmp_path / "dot.png").write_bytes(DOT)
    (tmp_path / "notes.txt").write_text("remember this\n")
    page = workbench.new_page()
    open_session(page, session.pk)

    page.locator(".composer [data-role=file-input]").set_input_files(
        [str(tmp_path / "dot.png"), str(tmp_path / "notes.txt")]
    )
    wait_thumbnail_loaded(page.locator(".composer"), "dot.png")
    composer_chip(page, "notes.txt").get_by_text("14 B").wait_for()
    # Removable before sending, by a named button.
    page.get_by_role("button", name="Remove notes.txt").click()
    assert composer_chip(page, "notes.txt").count() == 0
    assert page.get_by_role("button", name="Attach files").is_visible()
    workbench.screenshot(page, "attachments-composer")

    send(page, "fast what did I send")

    settled = wait_settled(page, 1)
    assert page.locator(".composer-attachments").is_hidden()
    wait_thumbnail_loaded(settled.locator(".user-turn"), "dot.png")
    assert "Received image dot.png (image/png" in settled.locator(".assistant").inner_text()
    assert "notes.txt" not in settled.inner_text()
    workbench.screenshot(page, "attachments-turn")

    page.reload()
    page.wait_for_selector("#workbench[data-ready='true']")
    wait_thumbnail_loaded(turn(page).locator(".user-turn"), "dot.png")
    link = turn(page).get_by_role("link", name="dot.png")
    assert link.get_attribute("href").endswith("/content")


def test_editing_a_turn_brings_its_attachments_back_into_the_composer(
    workbench: Workbench, session: Any, tmp_path: Path
) -> None:
    (tmp_path / "dot.png").write_bytes(DOT)
    page = workbench.new_page()
    open_session(page, session.pk)
    page.locator(".composer [data-role=file-input]").set_input_files([str(tmp_path / "dot.png")])
    wait_thumbnail_loaded(page.locator(".composer"), "dot.png")
    send(page, "fast look at this")
    settled = wait_settled(page, 1)
    assert page.locator(".composer-attachments").is_hidden()

    settled.get_by_role("button", name="Edit prompt in the composer").click()
    assert page.locator(".composer textarea").input_value() == "fast look at this"
    wait_thumbnail_loaded(page.locator(".composer"), "dot.png")
    send(page, "fast look again")
    again = wait_settled(page, 2)
    wait_thumbnail_loaded(again.locator(".user-turn"), "dot.png")
    assert "Received image dot.png (image/png" in again.locator(".assistant").inner_text()


def test_pasted_and_dropped_files_are_attached(workbench: Workbench, session: Any) -> None:
    page = workbench.new_page()
    open_session(page, session.pk)

    hand_over(page, "paste", "pasted.png", DOT, "image/png")
    hand_over(page, "drop", "dropped.md", b"# dropped\n", "text/markdown")

    wait_thumbnail_loaded(page.locator(".composer"), "pasted.png")
    composer_chip(page, "dropped.md").get_by_text("10 B").wait_for()
    send(page, "fast both please")
    settled = wait_settled(page, 1)
    answer = settled.locator(".assistant").inner_text()
    assert (
        "Received image pasted.png" in answer
        and "Received file dropped.md (text/markdown, 10 bytes)" in answer
    )
    assert settled.locator(".user-turn .attachment").count() == 2


def test_a_refused_file_is_shown_as_refused_and_can_be_removed(workbench: Workbench, session: Any) -> None:
    page = workbench.new_page()
    open_session(page, session.pk)

    hand_over(page, "drop", "tool.bin", b"\x00\x01binary", "application/octet-stream")

    chip = composer_chip(page, "tool.bin")
    chip.get_by_text("Only images").wait_for()
    assert chip.get_attribute("data-state") == "error"
    page.get_by_role("button", name="Remove tool.bin").click()
    assert page.locator(".composer-attachments").is_hidden()


@pytest.mark.parametrize(("scheme", "viewport"), [("dark", None), ("light", PHONE)], ids=["dark", "phone"])
def test_attachments_screenshots_in_dark_and_on_a_phone(
    workbench: Workbench, session: Any, scheme: str, viewport: dict[str, int] | None
) -> None:
    page = workbench.new_page(color_scheme=scheme, viewport=viewport)
    open_session(page, session.pk)
    hand_over(page, "paste", "dot.png", DOT, "image/png")
    wait_thumbnail_loaded(page.locator(".composer"), "dot.png")
    send(page, "fast look at this")
    wait_settled(page, 1)
    hand_over(page, "drop", "a-rather-long-file-name-for-notes.txt", b"notes\n", "text/plain")
    hand_over(page, "paste", "second.png", DOT, "image/png")
    wait_thumbnail_loaded(page.locator(".composer"), "second.png")
    name = "attachments-dark" if scheme == "dark" else "attachments-phone"
    workbench.screenshot(page, name)


def composer_note(page: Any) -> Any:
    note = page.locator(".composer [data-role=note]")
    note.wait_for()
    return note


def test_send_refuses_while_a_file_is_refused_and_keeps_the_text_and_the_other_files(
    workbench: Workbench, session: Any
) -> None:
    page = workbench.new_page()
    open_session(page, session.pk)
    hand_over(page, "paste", "dot.png", DOT, "image/png")
    hand_over(page, "drop", "tool.bin", b"\x00\x01binary", "application/octet-stream")
    wait_thumbnail_loaded(page.locator(".composer"), "dot.png")
    composer_chip(page, "tool.bin").get_by_text("Only images").wait_for()

    send(page, "fast look at these")
    # Not sent without the file the user attached, and told why; nothing typed or attached is lost.
    note = composer_note(page)
    assert "Not sent" in note.inner_text() and "tool.bin" in note.inner_text()
    assert page.locator(".composer textarea").input_value() == "fast look at these"
    assert composer_chip(page, "dot.png").get_attribute("data-state") == "ready"
    assert page.locator(".outgoing").count() == 0
    assert not Run.objects.filter(session=session).exists()
    workbench.screenshot(page, "attachments-send-refused")

    page.get_by_role("button", name="Remove tool.bin").click()
    note.wait_for(state="hidden")
    page.locator(".composer textarea").press("Enter")
    settled = wait_settled(page, 1)
    assert [a["name"] for a in Run.objects.get(session=session).attachments] == ["dot.png"]
    assert settled.locator(".user-turn .attachment").count() == 1


def test_an_upload_that_failed_on_the_way_is_retried_from_its_chip_before_sending(
    workbench: Workbench, session: Any
) -> None:
    page = workbench.new_page()
    open_session(page, session.pk)
    upload = "**/api/sessions/*/attachments"
    page.route(upload, lambda route: route.abort("connectionrefused"))
    hand_over(page, "drop", "notes.txt", b"remember this\n", "text/plain")
    chip = composer_chip(page, "notes.txt")
    page.locator(".composer-attachments .attachment[data-state='error']").wait_for()

    send(page, "fast read the notes")
    note = composer_note(page)
    assert "notes.txt" in note.inner_text() and "Retry" in note.inner_text()
    assert page.locator(".composer textarea").input_value() == "fast read the notes"
    assert not Run.objects.filter(session=session).exists()

    page.unroute(upload)
    chip.get_by_role("button", name="Retry notes.txt").click()
    page.locator(".composer-attachments .attachment[data-state='ready']").wait_for()
    note.wait_for(state="hidden")
    page.locator(".composer textarea").press("Enter")
    wait_settled(page, 1)
    assert [a["name"] for a in Run.objects.get(session=session).attachments] == ["notes.txt"]
