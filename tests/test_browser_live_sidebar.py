"""Knowing what runs: the sidebar shows every session's live state, pushed over the tab's socket.

Two tabs of one browser: a background session that asks for approval updates both sidebars
and both tab titles ("(1) …"), and exactly one tab notifies (a stubbed window.Notification);
with the setting off, nothing is notified. Design notes: docs/ui.md, docs/live-delivery.md.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from intents.models import PendingIntent
from runs import controls, services
from runs.models import Run, Runner, RunStatus
from tests import factories
from tests.support.browser import Workbench, browser, open_session, screenshots, workbench  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

# Every notification a tab shows lands in localStorage, which the tabs of a context share.
STUB_NOTIFICATION = """
window.Notification = class {
  static permission = 'granted';
  static requestPermission() { return Promise.resolve('granted'); }
  constructor(title, options) {
    const notes = JSON.parse(localStorage.getItem('test.notes') || '[]');
    notes.push({ title, body: options && options.body, tag: options && options.tag });
    localStorage.setItem('test.notes', JSON.stringify(notes));
  }
  close() {}
};
"""


def notes(page: Any) -> list[dict[str, Any]]:
    return json.loads(page.evaluate("() => localStorage.getItem('test.notes') || '[]'"))


def wait_notes(page: Any, count: int) -> list[dict[str, Any]]:
    page.wait_for_function(
        "(n) => JSON.parse(localStorage.getItem('test.notes') || '[]').length >= n", arg=count
    )
    return notes(page)


def badge(page: Any, session_id: int, kind: str) -> Any:
    return page.locator(f".session[data-session-id='{session_id}'] .live-state.{kind}")


def wait_idle(page: Any, session_id: int) -> None:
    page.wait_for_function(
        "(id) => { const row = document.querySelector(`.session[data-session-id='${id}']`);"
        " return row && !row.querySelector('.live-state'); }",
        arg=session_id,
    )


def run_of(client_id: str) -> Run:
    return Run.objects.get(client_id=client_id)


def test_a_background_session_asking_for_approval_reaches_both_tabs_and_one_notification(
    workbench: Workbench, user: Any
) -> None:
    project = factories.ProjectFactory(owner=user, name="Demo project")
    here = factories.SessionFactory(project=project, title="Open here")
    background = factories.SessionFactory(project=project, title="Background work")
    page = workbench.new_page()
    page.context.add_init_script(STUB_NOTIFICATION)
    other = page.context.new_page()  # a second tab of the same browser
    workbench.watch(other)
    open_session(page, here.pk)
    other.goto(f"/projects/{project.pk}/")  # no session open: the tab's socket is /ws/live/
    other.wait_for_selector("#workbench[data-ready='true']")
    # Its status line shows that socket, not "not connected".
    other.wait_for_selector(".connection[data-state='live']")
    for tab in (page, other):
        tab.wait_for_function("() => document.querySelector('link[rel=icon]')?.dataset.count === '0'")
        assert not tab.title().startswith("(")

    services.do_submit_message(background, client_id="bg-1", text="approve this write")
    for tab in (page, other):
        badge(tab, background.pk, "needs-you").wait_for()
        tab.wait_for_function("() => document.title.startsWith('(1) ')")
        assert tab.locator("link[rel=icon]").get_attribute("data-count") == "1"
        assert badge(tab, here.pk, "needs-you").count() == 0
    shown = wait_notes(page, 1)
    assert [(n["title"], n["body"]) for n in shown] == [("Background work", "Approval needed.")]

    # A message queued behind it shows its count; a cancel ends the run and drains the queue
    # into a new turn, which asks again: one notification per request, from one tab.
    services.do_submit_message(background, client_id="bg-2", text="approve it again", mode="queue")
    badge(other, background.pk, "queued").wait_for()
    assert badge(other, background.pk, "queued").inner_text() == "+1"
    controls.do_cancel(run_of("bg-1"))
    badge(page, background.pk, "queued").wait_for(state="detached")
    shown = wait_notes(page, 2)
    assert len(shown) == 2 and shown[1]["tag"] != shown[0]["tag"]

    # Off (the switch in the sidebar, persisted): the run's end notifies nobody.
    switch = other.get_by_role("switch", name="Notifications")
    switch.click()
    assert switch.get_attribute("aria-checked") == "false"
    page.wait_for_function("() => localStorage.getItem('hermesweb.notify') === 'off'")
    controls.do_cancel(Run.objects.filter(session=background).exclude(client_id="bg-1").get())
    for tab in (page, other):
        wait_idle(tab, background.pk)
        tab.wait_for_function("() => !document.title.startsWith('(')")
    assert len(notes(page)) == 2

    # On again: the next request notifies.
    switch.click()
    services.do_submit_message(background, client_id="bg-3", text="approve once more")
    shown = wait_notes(page, 3)
    assert shown[2]["body"] == "Approval needed."
    assert len(wait_notes(other, 3)) == 3


def test_the_sidebar_shows_each_sessions_state_light_dark_and_phone(workbench: Workbench, user: Any) -> None:
    project = factories.ProjectFactory(owner=user, name="Demo project")
    other_project = factories.ProjectFactory(owner=user, name="Docs site", path=project.path)
    here = factories.SessionFactory(project=project, title="Refactor the parser")
    # Runs another runner (on another host) holds: this test's runner neither claims nor reaps them.
    Runner.objects.create(id="elsewhere", host="elsewhere.invalid", pid=1)
    held = {"lease_owner": "elsewhere", "lease_expires_at": timezone.now() + timedelta(hours=1)}
    states = [
        ("Add the search page", RunStatus.RUNNING),
        ("Fix the flaky test", RunStatus.AWAITING_APPROVAL),
        ("Rename the settings", RunStatus.AWAITING_CLARIFY),
        ("Update dependencies", RunStatus.FAILED),
    ]
    sessions = {}
    for title, status in states:
        session = sessions[status] = factories.SessionFactory(project=project, title=title)
        factories.RunFactory(session=session, status=status, **(held if status != RunStatus.FAILED else {}))
    PendingIntent.objects.create(session=sessions[RunStatus.RUNNING], client_id="q-1", text="then lint")
    PendingIntent.objects.create(session=sessions[RunStatus.RUNNING], client_id="q-2", text="then test")
    elsewhere = factories.SessionFactory(project=other_project, title="Publish")
    factories.RunFactory(session=elsewhere, status=RunStatus.AWAITING_APPROVAL, **held)

    for scheme in ("light", "dark"):
        page = workbench.new_page(color_scheme=scheme)
        open_session(page, here.pk)
        badge(page, sessions[RunStatus.RUNNING].pk, "running").wait_for()
        assert badge(page, sessions[RunStatus.RUNNING].pk, "queued").inner_text() == "+2"
        assert badge(page, sessions[RunStatus.AWAITING_APPROVAL].pk, "needs-you").inner_text() == "needs you"
        assert badge(page, sessions[RunStatus.AWAITING_CLARIFY].pk, "needs-you").count() == 1
        assert badge(page, sessions[RunStatus.FAILED].pk, "failed").count() == 1
        assert page.get_by_role("img", name="Needs you: approval").count() == 1
        assert page.get_by_role("img", name="2 queued messages").count() == 1
        # The collapsed project counts its sessions that need the user; the tab, all of them.
        project_row = page.locator(f".project[data-project-id='{other_project.pk}'] .project-live")
        assert project_row.get_by_role("img", name="1 session needs you").count() == 1
        page.wait_for_function("() => document.title.startsWith('(3) ')")
        if scheme == "light":
            workbench.docs_screenshot(page, "sidebar-live-states")
        else:
            workbench.screenshot(page, "sidebar-live-states-dark")

    phone = workbench.new_page(viewport={"width": 420, "height": 860})
    open_session(phone, here.pk)
    phone.get_by_role("button", name="Open sidebar").click()
    badge(phone, sessions[RunStatus.AWAITING_APPROVAL].pk, "needs-you").wait_for()
    workbench.screenshot(phone, "sidebar-live-states-phone")
