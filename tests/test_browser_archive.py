"""Archiving from the browser: a session archived from the sidebar opens read-only (the composer says
why and offers Restore) and waits in its project's Archived list; a project archived from its
settings leaves the project list for "Archived projects" and its sessions lock, until restored.

The API's side is tests/test_archive.py.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from projects.models import Project, ProjectStatus, Session, SessionStatus
from tests import factories
from tests.support.browser import (  # noqa: F401 - fixtures
    Workbench,
    axe_violations,
    browser,
    open_session,
    screenshots,
    send,
    wait_settled,
    workbench,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

PHONE = {"width": 420, "height": 860}
FITS = (
    "(selector) => { const el = document.querySelector(selector); return el.scrollWidth <= el.clientWidth; }"
)
DESKTOP = {"width": 1200, "height": 760}
SESSION_LOCK = "This session is archived: it can be read but takes no new messages."


@pytest.fixture
def project(user: Any) -> Any:
    return factories.ProjectFactory(owner=user, name="Demo project", agent="demo")


def sidebar_session(page: Any, title: str) -> Any:
    return page.locator("#sidebar .session", has=page.get_by_role("link", name=title, exact=True))


def archived_toggle(page: Any, project: Any) -> Any:
    return page.locator(
        f"#sidebar .project[data-project-id='{project.pk}'] .archived-sessions .section-toggle"
    )


def status_of(model: Any, pk: int) -> str:
    return str(model.objects.get(pk=pk).status)


def test_a_session_is_archived_opens_read_only_and_is_restored(
    workbench: Workbench, project: Any, user: Any
) -> None:
    kept = factories.SessionFactory(project=project, title="Keep me")
    old = factories.SessionFactory(project=project, title="Old idea")
    page = workbench.new_page(viewport=DESKTOP)
    open_session(page, old.pk)
    send(page, "hello fast")
    wait_settled(page, 1)

    # Archived from its sidebar entry: the entry moves to the Archived list, opened because
    # the page is on it, and the composer locks with the reason and the way back.
    sidebar_session(page, "Old idea").hover()
    page.get_by_role("button", name="Archive Old idea").click()
    lock = page.locator(".composer-lock")
    lock.wait_for(state="visible")
    assert lock.get_by_role("status").inner_text() == SESSION_LOCK
    assert page.locator(".composer textarea").is_hidden()
    assert archived_toggle(page, project).get_attribute("aria-expanded") == "true"
    assert archived_toggle(page, project).inner_text().endswith("Archived (1)")
    page.get_by_role("list", name="Archived sessions of Demo project").get_by_role(
        "link", name="Old idea"
    ).wait_for()
    assert status_of(Session, old.pk) == SessionStatus.ARCHIVED

    # Opened again it is read-only from the start, its transcript all there.
    open_session(page, old.pk)
    wait_settled(page, 1)
    assert page.locator(".composer-lock").is_visible()
    assert page.get_by_role("button", name="Restore session", exact=True).is_visible()
    workbench.screenshot(page, "archived-session")

    # From another session the Archived list is collapsed; opened, it offers Restore.
    open_session(page, kept.pk)
    toggle = archived_toggle(page, project)
    assert toggle.get_attribute("aria-expanded") == "false"
    assert sidebar_session(page, "Old idea").count() == 0 or sidebar_session(page, "Old idea").is_hidden()
    assert page.locator(".composer-lock").is_hidden()
    toggle.click()
    assert toggle.get_attribute("aria-expanded") == "true"
    page.get_by_role("button", name="Restore Old idea").click()
    page.locator("#sidebar .session-list:not(.archived) .session", has_text="Old idea").wait_for()
    assert archived_toggle(page, project).count() == 0
    assert status_of(Session, old.pk) == SessionStatus.ACTIVE

    # Archived and restored from the composer's own button: it takes messages again.
    open_session(page, old.pk)
    sidebar_session(page, "Old idea").hover()
    page.get_by_role("button", name="Archive Old idea").click()
    page.get_by_role("button", name="Restore session", exact=True).click()
    page.locator(".composer textarea").wait_for(state="visible")
    assert page.locator(".composer-lock").is_hidden()
    assert status_of(Session, old.pk) == SessionStatus.ACTIVE
    send(page, "hello again fast")
    wait_settled(page, 2)


def test_a_project_is_archived_from_its_settings_and_restored(
    workbench: Workbench, project: Any, user: Any
) -> None:
    other = factories.ProjectFactory(owner=user, name="Other project", agent="demo")
    session = factories.SessionFactory(project=project, title="Release notes")
    page = workbench.new_page(viewport=DESKTOP)
    open_session(page, session.pk)

    page.get_by_role("button", name="Edit project Demo project").click()
    dialog = page.get_by_role("dialog", name="Project “Demo project”")
    dialog.get_by_role("button", name="Archive project").click()
    dialog.wait_for(state="detached")
    lock = page.locator(".composer-lock")
    lock.wait_for(state="visible")
    assert "The project “Demo project” is archived" in lock.inner_text()
    archived = page.get_by_role("list", name="Archived projects")
    archived.locator(".project-name", has_text="Demo project").wait_for()
    main_list = page.locator("[data-role=project-list] > .project .project-name")
    assert main_list.all_inner_texts() == ["Other project"]
    assert status_of(Project, project.pk) == ProjectStatus.ARCHIVED
    api = Client()
    api.force_login(user)
    assert [p["name"] for p in api.get("/api/projects").json()] == ["Other project"]

    # The project's own page is read-only too, and so is every session in it.
    page.goto(f"/projects/{project.pk}/")
    page.wait_for_selector("#workbench[data-ready='true']")
    assert page.get_by_role("button", name="Restore project", exact=True).is_visible()
    assert page.locator(".composer textarea").is_hidden()
    workbench.screenshot(page, "archived-project")

    # Elsewhere the section is collapsed; opened, it offers Restore.
    page.goto(f"/projects/{other.pk}/")
    page.wait_for_selector("#workbench[data-ready='true']")
    toggle = page.get_by_role("button", name="Archived projects (1)")
    assert toggle.get_attribute("aria-expanded") == "false"
    assert page.get_by_role("list", name="Archived projects").is_hidden()
    toggle.click()
    page.get_by_role("button", name="Restore project Demo project").click()
    page.locator("[data-role=project-list] > .project .project-name", has_text="Demo project").wait_for()
    assert page.get_by_role("button", name=re.compile(r"^Archived projects")).count() == 0
    assert status_of(Project, project.pk) == ProjectStatus.ACTIVE

    # Archived elsewhere (another tab, the API): the session page offers Restore project; then it sends.
    api.patch(f"/api/projects/{project.pk}", {"status": "archived"}, content_type="application/json")
    open_session(page, session.pk)
    page.get_by_role("button", name="Restore project", exact=True).click()
    page.locator(".composer textarea").wait_for(state="visible")
    assert status_of(Project, project.pk) == ProjectStatus.ACTIVE
    send(page, "hello fast")
    wait_settled(page, 1)


def test_the_archived_lists_light_and_on_a_phone(workbench: Workbench, project: Any, user: Any) -> None:
    """The screenshots docs/ui.md shows: a project's Archived list and the Archived projects."""
    current = factories.SessionFactory(project=project, title="Refactor the parser")
    factories.SessionFactory(project=project, title="Fix the login redirect")
    for title in ("Spike: websocket compression", "Old benchmark notes"):
        factories.SessionFactory(project=project, title=title, status=SessionStatus.ARCHIVED)
    factories.ProjectFactory(owner=user, name="Website", agent="demo")
    factories.ProjectFactory(owner=user, name="Old prototype", agent="demo", status=ProjectStatus.ARCHIVED)

    def expand(page: Any) -> None:
        archived_toggle(page, project).click()
        page.get_by_role("button", name="Archived projects (1)").click()
        page.get_by_role("button", name="Restore project Old prototype").wait_for()
        page.mouse.move(1, 1)  # no hover left on a toggle in the picture

    page = workbench.new_page(viewport=DESKTOP, bypass_csp=True)  # for axe-core
    open_session(page, current.pk)
    send(page, "hello fast")
    wait_settled(page, 1)
    expand(page)
    workbench.docs_screenshot(page, "archived-list")
    assert axe_violations(page) == []

    phone = workbench.new_page(viewport=PHONE, bypass_csp=True)
    open_session(phone, current.pk)
    phone.get_by_role("button", name="Open sidebar").click()
    phone.locator("#sidebar .session.current").wait_for(state="visible")
    expand(phone)
    # The sidebar has finished sliding in (its transform is none) before the picture.
    phone.wait_for_function("getComputedStyle(document.getElementById('sidebar')).transform === 'none'")
    workbench.docs_screenshot(phone, "archived-list-phone")
    # Everything in the drawer fits its width: nothing scrolls sideways.
    assert phone.evaluate(FITS, ".sidebar-scroll")

    # A locked composer on a phone: the reason wraps, Restore stays in reach.
    archived = Session.objects.filter(project=project, status=SessionStatus.ARCHIVED).first()
    assert archived is not None
    open_session(phone, archived.pk)
    assert phone.get_by_role("button", name="Restore session", exact=True).is_visible()
    # Nothing scrolls sideways, the project's long directory in the empty state included.
    assert phone.evaluate(FITS, ".scroller")
    assert axe_violations(phone) == []
    box = phone.locator(".composer").bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
