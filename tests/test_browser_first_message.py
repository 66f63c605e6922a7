"""The first message from a project's page, with attachments: the session is created, the files go
up to it, and the message names them — sent once, by its client id, from the session's page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from projects.models import Session
from runs.models import Attachment, Run
from tests import factories
from tests.support.browser import (  # noqa: F401 - fixtures
    Workbench,
    browser,
    screenshots,
    turn,
    wait_settled,
    workbench,
)
from tests.support.images import png

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

DOT = png(24, 24, (230, 120, 20))
PHONE = {"width": 390, "height": 844}


@pytest.fixture
def project(user: Any) -> Any:
    return factories.ProjectFactory(owner=user, name="Demo project")


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    paths = {"dot.png": DOT, "notes.txt": b"remember this\n", "blob.bin": b"\x00\x01binary\x00"}
    for name, data in paths.items():
        (tmp_path / name).write_bytes(data)
    return {name: tmp_path / name for name in paths}


def open_project(page: Any, project: Any) -> None:
    page.goto(f"/projects/{project.pk}/")
    page.wait_for_selector("#workbench[data-ready='true']")


def attach(page: Any, *paths: Path) -> None:
    page.locator(".composer [data-role=file-input]").set_input_files([str(p) for p in paths])
    for path in paths:
        composer_chip(page, path.name).wait_for()


def composer_chip(page: Any, name: str) -> Any:
    return page.locator(".composer-attachments .attachment").filter(has_text=name)


def send_first(page: Any, text: str) -> None:
    box = page.locator(".composer textarea")
    box.fill(text)
    box.press("Enter")


def test_the_first_message_from_a_project_page_carries_its_attachments(
    workbench: Workbench, project: Any, files: dict[str, Path]
) -> None:
    page = workbench.new_page()
    open_project(page, project)
    page.get_by_role("button", name="Attach files").wait_for()
    attach(page, files["dot.png"], files["notes.txt"])
    # Shown before any session exists: the image's own thumbnail, the text file's badge and size.
    thumbnail = composer_chip(page, "dot.png").get_by_role("img", name="dot.png")
    thumbnail.wait_for()
    assert thumbnail.evaluate("img => img.complete && img.naturalWidth") == 24
    assert composer_chip(page, "notes.txt").get_attribute("data-state") == "pending"
    assert not Session.objects.filter(project=project).exists()  # nothing created until Send
    workbench.screenshot(page, "first-message-attachments")

    send_first(page, "what is in these files")
    page.wait_for_url("**/sessions/*/")
    settled = wait_settled(page, 1)

    session = Session.objects.get(project=project)
    run = Run.objects.get(session=session)  # one turn: the outbox sent it once
    assert [a["name"] for a in run.attachments] == ["dot.png", "notes.txt"]
    stored = Attachment.objects.filter(pk__in=[a["id"] for a in run.attachments])
    assert {a.session_id for a in stored} == {session.pk}
    shown = settled.locator(".attachments .attachment")
    assert shown.count() == 2
    assert settled.locator(".user-text").inner_text() == "what is in these files"
    workbench.screenshot(page, "first-message-attachments-sent")

    # A reload re-sends nothing: the message went out once, under its client id.
    page.reload()
    page.wait_for_selector("#workbench[data-ready='true']")
    wait_settled(page, 1)
    assert Run.objects.filter(session=session).count() == 1


def test_a_file_that_cannot_go_up_keeps_the_first_message_and_a_retry_reuses_the_session(
    workbench: Workbench, project: Any, files: dict[str, Path]
) -> None:
    page = workbench.new_page()
    open_project(page, project)
    attach(page, files["notes.txt"], files["blob.bin"])

    send_first(page, "read the notes")
    dialog = page.get_by_role("dialog")
    dialog.wait_for()
    assert "blob.bin" in dialog.inner_text()
    dialog.get_by_role("button", name="OK").click()
    # Still on the project's page, the message and the files kept; the refused file says why.
    assert page.locator(".composer textarea").input_value() == "read the notes"
    refused = composer_chip(page, "blob.bin")
    assert refused.get_attribute("data-state") == "error"
    assert "UTF-8 text" in refused.inner_text()
    assert composer_chip(page, "notes.txt").get_attribute("data-state") == "ready"
    assert not Run.objects.exists()
    workbench.screenshot(page, "first-message-attachment-refused")

    refused.get_by_role("button", name="Remove blob.bin").click()
    page.locator(".composer textarea").press("Enter")
    page.wait_for_url("**/sessions/*/")
    settled = wait_settled(page, 1)

    session = Session.objects.get(project=project)  # the first attempt's session, not a second one
    run = Run.objects.get(session=session)
    assert [a["name"] for a in run.attachments] == ["notes.txt"]
    assert settled.locator(".attachments .attachment").count() == 1


@pytest.mark.parametrize("look", ["dark", "phone"])
def test_attachments_on_a_project_page_in_dark_and_on_a_phone(
    workbench: Workbench, project: Any, files: dict[str, Path], look: str
) -> None:
    page = workbench.new_page(
        color_scheme="dark" if look == "dark" else "light", viewport=PHONE if look == "phone" else None
    )
    open_project(page, project)
    attach(page, files["dot.png"], files["notes.txt"])
    page.locator(".composer textarea").fill("what is in these files")
    # The tray and the message box stay inside the screen.
    width = page.evaluate("() => document.documentElement.clientWidth")
    for name in ("dot.png", "notes.txt"):
        box = composer_chip(page, name).bounding_box()
        assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= width
    workbench.screenshot(page, f"first-message-attachments-{look}")
