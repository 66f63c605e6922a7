"""Signing in and finding one's way in a real browser: sidebar, search, rename, delete, workflows.

See tests/test_browser_workbench.py for the conversation itself.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher
from django.contrib.sessions.models import Session as DjangoSession

from projects.models import Session
from tests import factories
from tests.support.browser import (  # noqa: F401 - fixtures
    Workbench,
    browser,
    open_session,
    screenshots,
    send,
    wait_settled,
    workbench,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]


@pytest.fixture
def project(user: Any) -> Any:
    return factories.ProjectFactory(owner=user, name="Demo project")


def with_real_password(user: Any) -> None:
    # The tests' MD5 hasher is not one the sign-in page accepts.
    user.password = PBKDF2PasswordHasher().encode(
        "correct horse battery staple", PBKDF2PasswordHasher().salt()
    )
    user.save(update_fields=["password"])


def sign_in(page: Any) -> None:
    page.get_by_label("Username").fill("ada")
    page.get_by_label("Password").fill("correct horse battery staple")
    page.get_by_role("button", name="Sign in").click()


def test_sign_in_lands_in_the_project_and_a_first_message_streams(
    workbench: Workbench, project: Any, user: Any
) -> None:
    # The test settings hash with MD5 for speed; daphne runs with the real hashers.
    with_real_password(user)
    page = workbench.new_page(signed_in=False)
    page.goto("/")
    page.wait_for_url(re.compile(r"/login/\?next=/$"))
    workbench.screenshot(page, "20-sign-in")
    sign_in(page)
    page.wait_for_url(re.compile(rf"/projects/{project.pk}/$"))
    page.wait_for_selector("#workbench[data-ready='true']")

    # No session yet: the first message makes one and streams in it.
    send(page, "hello fast")
    page.wait_for_url(re.compile(r"/sessions/\d+/$"))
    wait_settled(page, 1)
    session = Session.objects.get(project=project)
    assert page.url.endswith(f"/sessions/{session.pk}/")
    assert session.runs.count() == 1

    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(re.compile(r"/login/$"))


def test_a_message_sent_after_the_sign_in_ended_is_kept_and_sent_once_signed_in_again(
    workbench: Workbench, project: Any, user: Any
) -> None:
    with_real_password(user)
    session = factories.SessionFactory(project=project)
    page = workbench.new_page()
    open_session(page, session.pk)
    # The live socket's first frames make the page read the transcript again: a read after
    # the sign-out below would leave for the sign-in page before anything is typed.
    page.wait_for_load_state("networkidle")

    DjangoSession.objects.all().delete()  # signed out in another tab
    send(page, "hello fast")

    # Refused over the socket (401, then 4401): to the sign-in page, the message kept.
    page.wait_for_url(re.compile(rf"/login/\?next=%2Fsessions%2F{session.pk}%2F$"))
    assert session.runs.count() == 0
    sign_in(page)
    page.wait_for_url(re.compile(rf"/sessions/{session.pk}/$"))
    wait_settled(page, 1)
    assert page.locator(".user-text").all_inner_texts() == ["hello fast"]
    assert session.runs.count() == 1
    assert page.evaluate("sessionStorage.getItem('hermesweb.outbox.v1')") == "[]"


def test_the_sidebar_searches_renames_deletes_and_makes_sessions(workbench: Workbench, project: Any) -> None:
    alpha = factories.SessionFactory(project=project, title="Alpha fix")
    beta = factories.SessionFactory(project=project, title="Beta docs")
    page = workbench.new_page()
    open_session(page, alpha.pk)
    sidebar = page.locator("#sidebar")
    titles = sidebar.locator(".session .session-title")
    assert sorted(titles.all_inner_texts()) == ["Alpha fix", "Beta docs"]

    sidebar.get_by_placeholder("Search sessions…").fill("beta")
    page.wait_for_function("() => document.querySelectorAll('#sidebar .session').length === 1")
    assert titles.all_inner_texts() == ["Beta docs"]
    sidebar.get_by_placeholder("Search sessions…").fill("")

    sidebar.get_by_role("button", name="Rename Alpha fix").click()
    rename = sidebar.locator(".rename-input")
    rename.fill("Alpha, renamed")
    rename.press("Enter")
    sidebar.locator(".session.current .session-title", has_text="Alpha, renamed").wait_for()
    page.wait_for_function(
        "() => document.querySelector('[data-role=title]').textContent === 'Alpha, renamed'"
    )
    alpha.refresh_from_db()
    assert alpha.title == "Alpha, renamed"

    sidebar.get_by_role("button", name="Delete Beta docs").click()
    dialog = page.locator("dialog[open]")
    workbench.screenshot(page, "21-delete-session")
    dialog.get_by_role("button", name="Delete").click()
    page.wait_for_function("() => document.querySelectorAll('#sidebar .session').length === 1")
    assert not Session.objects.filter(pk=beta.pk).exists()

    with page.expect_navigation(url=re.compile(r"/sessions/\d+/$")):
        sidebar.locator(f".project[data-project-id='{project.pk}'] [data-role=new-session]").click()
    page.wait_for_selector("#workbench[data-ready='true']")
    assert not page.url.endswith(f"/sessions/{alpha.pk}/")
    assert Session.objects.filter(project=project).count() == 2
    fresh = Session.objects.filter(project=project).exclude(pk=alpha.pk).get()
    # The header names an untitled session as the sidebar does.
    assert page.locator("[data-role=title]").inner_text() == f"Untitled session {fresh.pk}"
    listed = sidebar.locator(f".session[data-session-id='{fresh.pk}']")
    listed.filter(has_text=f"Untitled session {fresh.pk}").wait_for()


def test_launching_a_workflow_starts_a_turn_in_a_new_session(workbench: Workbench, project: Any) -> None:
    factories.WorkflowFactory(project=project, name="Review", prompt_template="Review {file} fast")
    page = workbench.new_page()
    page.goto(f"/projects/{project.pk}/")
    page.wait_for_selector("#workbench[data-ready='true']")
    page.locator(".workflow", has_text="Review").get_by_role("button", name="Launch").click()
    dialog = page.locator("dialog[open]")
    dialog.locator("textarea[name='file']").fill("README.md")
    workbench.screenshot(page, "22-launch-workflow")
    dialog.get_by_role("button", name="Launch").click()
    page.wait_for_url(re.compile(r"/sessions/\d+/$"))
    settled = wait_settled(page, 1)
    assert settled.locator(".user-text").inner_text() == "Review README.md fast"
    assert settled.locator(".turn-source").inner_text() == "workflow: Review"
