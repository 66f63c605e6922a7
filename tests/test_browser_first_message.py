"""The first message from a project's page, with attachments: the session is created, the files go
up to it, and the message names them — sent once, by its client id, from the session's page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from projects.models import Session
from runs import attachments
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
    composer_chip(page, "notes.txt").and_(page.locator("[data-state='pending']")).wait_for()
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


def refused_dialog(page: Any) -> str:
    dialog = page.get_by_role("dialog")
    dialog.wait_for()
    said = dialog.inner_text()
    dialog.get_by_role("button", name="OK").click()
    return said


def test_a_file_of_a_refused_type_stops_the_first_message_before_any_session_exists(
    workbench: Workbench, project: Any, files: dict[str, Path]
) -> None:
    page = workbench.new_page()
    open_project(page, project)
    attach(page, files["notes.txt"], files["blob.bin"])
    # Said at once, on the file, before anything is sent.
    refused = composer_chip(page, "blob.bin")
    page.locator(".composer-attachments .attachment[data-state='error']").wait_for()
    assert "UTF-8 text" in refused.inner_text()
    composer_chip(page, "notes.txt").and_(page.locator("[data-state='pending']")).wait_for()

    send_first(page, "read the notes")
    assert "blob.bin" in refused_dialog(page)
    # Still on the project's page, the message and the files kept, and no session in the sidebar.
    assert page.locator(".composer textarea").input_value() == "read the notes"
    assert composer_chip(page, "notes.txt").get_attribute("data-state") == "pending"
    assert not Session.objects.filter(project=project).exists()
    workbench.screenshot(page, "first-message-attachment-refused")

    refused.get_by_role("button", name="Remove blob.bin").click()
    page.locator(".composer textarea").press("Enter")
    page.wait_for_url("**/sessions/*/")
    settled = wait_settled(page, 1)

    session = Session.objects.get(project=project)
    run = Run.objects.get(session=session)
    assert [a["name"] for a in run.attachments] == ["notes.txt"]
    assert settled.locator(".attachments .attachment").count() == 1


def refuse_uploads(page: Any) -> str:
    """Every upload answered 413, as only the server can (its size limit, whether the agent takes
    images); the route's pattern, to unroute."""
    too_large = '{"code": "attachment_too_large", "message": "An attachment may hold at most 4 bytes."}'
    upload = "**/api/sessions/*/attachments"
    page.route(
        upload, lambda route: route.fulfill(status=413, body=too_large, content_type="application/json")
    )
    return upload


def test_a_file_the_server_refuses_keeps_the_first_message_and_a_retry_reuses_the_session(
    workbench: Workbench, project: Any, files: dict[str, Path]
) -> None:
    page = workbench.new_page()
    upload = refuse_uploads(page)
    open_project(page, project)
    attach(page, files["notes.txt"])
    composer_chip(page, "notes.txt").and_(page.locator("[data-state='pending']")).wait_for()

    send_first(page, "read the notes")
    assert "notes.txt" in refused_dialog(page)
    assert page.locator(".composer textarea").input_value() == "read the notes"
    assert composer_chip(page, "notes.txt").get_attribute("data-state") == "error"
    first = Session.objects.get(project=project)  # created before the upload was refused

    page.unroute(upload)
    page.locator(".composer textarea").press("Enter")
    page.wait_for_url(f"**/sessions/{first.pk}/")
    wait_settled(page, 1)

    assert list(Session.objects.filter(project=project)) == [first]  # reused, not a second one
    run = Run.objects.get(session=first)
    assert [a["name"] for a in run.attachments] == ["notes.txt"]


def test_a_first_session_deleted_meanwhile_is_not_reused(
    workbench: Workbench, project: Any, files: dict[str, Path]
) -> None:
    page = workbench.new_page()
    upload = refuse_uploads(page)
    open_project(page, project)
    attach(page, files["notes.txt"])
    send_first(page, "read the notes")
    refused_dialog(page)
    Session.objects.filter(project=project).delete()  # from another tab, say
    page.unroute(upload)

    page.locator(".composer textarea").press("Enter")
    assert "notes.txt" in refused_dialog(page)  # the deleted session takes no file
    page.locator(".composer textarea").press("Enter")
    page.wait_for_url("**/sessions/*/")
    wait_settled(page, 1)

    session = Session.objects.get(project=project)
    assert [a["name"] for a in Run.objects.get(session=session).attachments] == ["notes.txt"]


# Files at the edges of the type rule: the page's check must answer as the server does.
SAMPLES = {
    "image.png": DOT,
    "photo.jpg": b"\xff\xd8\xff\xe0" + b"\x00" * 32,
    "old.gif": b"GIF87a" + b"\x00" * 16,
    "new.gif": b"GIF89a" + b"\x00" * 16,
    "pic.webp": b"RIFF\x10\x00\x00\x00WEBPVP8 " + b"\x00" * 16,
    "riff.wav": b"RIFF\x10\x00\x00\x00WAVEfmt " + b"\x00" * 16,
    "plain.txt": b"plain text\n",
    "bom.txt": b"\xef\xbb\xbfwith a byte order mark",
    "accents.md": "déjà vu, ünïcödé, 漢字, 🙂".encode(),
    "nul.txt": b"text with a \x00 inside",
    "latin1.txt": "café".encode("latin-1"),
    "cut.txt": "ends mid-character: é".encode()[:-1],
    "surrogate.txt": b"\xed\xa0\x80",
    "overlong.txt": b"\xc0\xaf",
    "beyond.txt": b"\xf4\x90\x80\x80",
    "late.txt": b"a" * (1 << 20) + "é".encode() + b"\xff",
    "split.txt": b"a" * ((1 << 20) - 1) + "é".encode(),
    "empty.txt": b"",
    "blob.bin": b"\x00\x01binary\x00",
}


def server_verdicts(user: Any, project: Any, files: dict[str, bytes], refused_with: str) -> dict[str, str]:
    """Each file's chip state as the server's upload rule decides it: `pending` taken, `error` refused."""
    session = factories.SessionFactory(project=project)
    verdicts: dict[str, str] = {}
    for name, data in files.items():
        try:
            attachments.do_upload_attachment(user, session.pk, attachments.Upload(name, [data], len(data)))
            verdicts[name] = "pending"
        except attachments.AttachmentRefused as exc:
            assert exc.code == refused_with
            verdicts[name] = "error"
    return verdicts


def page_verdicts(
    workbench: Workbench, project: Any, tmp_path: Path, files: dict[str, bytes]
) -> dict[str, str]:
    """Each file's chip state once the project page has checked it, before any session exists."""
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    page = workbench.new_page()
    open_project(page, project)
    page.locator(".composer [data-role=file-input]").set_input_files([str(tmp_path / n) for n in files])
    page.wait_for_function(
        "count => [...document.querySelectorAll('.composer-attachments .attachment')]"
        ".filter(chip => chip.dataset.state !== 'checking').length === count",
        arg=len(files),
    )
    return {name: composer_chip(page, name).get_attribute("data-state") for name in files}


def test_the_pages_file_check_answers_as_the_servers_type_rule(
    workbench: Workbench, project: Any, tmp_path: Path, user: Any
) -> None:
    server = server_verdicts(user, project, SAMPLES, "unsupported_attachment")

    checked = page_verdicts(workbench, project, tmp_path, SAMPLES)

    assert checked == server
    assert "error" in server.values() and "pending" in server.values()


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


def attachment_limit(workbench: Workbench, limit: int) -> None:
    """daphne again, taking attachments of at most `limit` bytes (the page's data says so too)."""
    workbench.restart_daphne(HERMESWEB_ATTACHMENT_MAX_BYTES=str(limit))


def test_a_file_over_the_size_limit_stops_the_first_message_before_any_session_exists(
    workbench: Workbench, project: Any, tmp_path: Path
) -> None:
    attachment_limit(workbench, 64)
    (tmp_path / "big.txt").write_text("x" * 65)
    (tmp_path / "small.txt").write_text("x" * 64)
    page = workbench.new_page()
    open_project(page, project)
    attach(page, tmp_path / "big.txt", tmp_path / "small.txt")
    # Said at once, on the file, in the server's own words.
    big = composer_chip(page, "big.txt")
    assert big.get_attribute("data-state") == "error"
    assert "at most 64 bytes" in big.inner_text()
    composer_chip(page, "small.txt").and_(page.locator("[data-state='pending']")).wait_for()

    send_first(page, "read the notes")
    said = refused_dialog(page)
    assert "big.txt" in said and "at most 64 bytes" in said
    # Nothing lost and nothing created: the text and both files stay on the project's page.
    assert page.locator(".composer textarea").input_value() == "read the notes"
    assert composer_chip(page, "small.txt").get_attribute("data-state") == "pending"
    assert not Session.objects.filter(project=project).exists()
    workbench.screenshot(page, "first-message-attachment-too-large")

    big.get_by_role("button", name="Remove big.txt").click()
    page.locator(".composer textarea").press("Enter")
    page.wait_for_url("**/sessions/*/")
    wait_settled(page, 1)
    run = Run.objects.get(session=Session.objects.get(project=project))
    assert [a["name"] for a in run.attachments] == ["small.txt"]


def test_the_pages_size_check_answers_as_the_servers_limit(
    workbench: Workbench, project: Any, tmp_path: Path, user: Any, settings: Any
) -> None:
    limit = 64
    settings.HERMESWEB_ATTACHMENT_MAX_BYTES = limit
    attachment_limit(workbench, limit)
    sizes = {"under.txt": limit - 1, "at.txt": limit, "over.txt": limit + 1, "huge.txt": 10 * limit}
    files = {name: b"x" * size for name, size in sizes.items()}
    server = server_verdicts(user, project, files, "attachment_too_large")

    checked = page_verdicts(workbench, project, tmp_path, files)

    assert checked == server
    assert [name for name, state in server.items() if state == "error"] == ["over.txt", "huge.txt"]
