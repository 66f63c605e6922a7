"""Appearance: light and dark (the system's, or the user's choice, kept), 200% zoom, the phone
layout (what needs the user first, the queue folded), accessible names, visible focus, and
axe-core on the main pages (no serious or critical violation).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests import factories
from tests.support.browser import (  # noqa: F401 - fixtures
    Workbench,
    axe_violations,
    browser,
    open_session,
    screenshots,
    send,
    turn,
    wait_settled,
    workbench,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

LIGHT_BG = "rgb(247, 247, 248)"
DARK_BG = "rgb(21, 23, 27)"
DOCS_VIEWPORT = {"width": 1200, "height": 760}


@pytest.fixture
def session(user: Any) -> Any:
    project = factories.ProjectFactory(owner=user, name="Demo project")
    return factories.SessionFactory(project=project, title="")


def background(page: Any) -> str:
    return page.evaluate("getComputedStyle(document.body).backgroundColor")


def fill_session(page: Any) -> None:
    """A settled tool turn and a settled markdown answer with code."""
    send(page, "tool fast")
    wait_settled(page, 1)
    send(page, "hello fast")
    wait_settled(page, 2)


def test_light_and_dark_follow_the_system_and_a_chosen_theme_is_kept(
    workbench: Workbench, session: Any
) -> None:
    page = workbench.new_page(viewport=DOCS_VIEWPORT, color_scheme="light")
    open_session(page, session.pk)
    fill_session(page)
    assert background(page) == LIGHT_BG
    toggle = page.get_by_role("button", name=re.compile(r"^Theme: "))
    assert toggle.get_attribute("aria-label") == "Theme: System"
    workbench.docs_screenshot(page, "light")

    toggle.click()
    assert toggle.get_attribute("aria-label") == "Theme: Light"
    assert background(page) == LIGHT_BG
    toggle.click()
    assert toggle.get_attribute("aria-label") == "Theme: Dark"
    assert background(page) == DARK_BG
    assert page.evaluate("localStorage.getItem('hermesweb.theme')") == "dark"
    # Kept: applied before the first paint of the next page (theme-init.js), not after the modules load.
    page.reload()
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    assert background(page) == DARK_BG
    page.wait_for_selector("#workbench[data-ready='true']")
    wait_settled(page, 2)
    workbench.docs_screenshot(page, "dark")
    # Another tab follows the choice.
    other = page.context.new_page()
    workbench.watch(other)
    open_session(other, session.pk)
    assert background(other) == DARK_BG
    page.get_by_role("button", name="Theme: Dark").click()
    assert background(page) == LIGHT_BG  # back to the system's, which is light here
    other.wait_for_function("() => !document.documentElement.dataset.theme")
    assert background(other) == LIGHT_BG

    # No choice made: a system in dark mode gets the dark theme.
    dark = workbench.new_page(color_scheme="dark")
    open_session(dark, session.pk)
    assert background(dark) == DARK_BG
    assert dark.get_by_role("button", name="Theme: System").count() == 1


def test_readable_at_200_percent_zoom(workbench: Workbench, session: Any) -> None:
    # 200% zoom of a 1280 x 860 window lays the page out in 640 x 430 CSS pixels.
    page = workbench.new_page(viewport={"width": 640, "height": 430})
    open_session(page, session.pk)
    fill_session(page)
    overflow = page.evaluate(
        """() => [...document.querySelectorAll(
                'body, .workbench, .main, .topbar, .scroller, .transcript, .composer')]
            .filter((el) => el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).overflowX !== 'auto')
            .map((el) => el.className || el.tagName)"""
    )
    assert overflow == []
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    for control in (
        page.get_by_role("textbox", name="Message"),
        page.get_by_role("button", name="Send", exact=True),
        page.get_by_role("button", name="Open sidebar"),
        page.get_by_role("heading", level=1),
    ):
        assert control.is_visible()
        box = control.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 640
    workbench.screenshot(page, "zoom-200")


def test_the_phone_layout_puts_what_needs_the_user_first(workbench: Workbench, session: Any) -> None:
    page = workbench.new_page(viewport={"width": 420, "height": 860})
    open_session(page, session.pk)
    send(page, "hello fast")
    wait_settled(page, 1)
    send(page, "approve this write")
    page.locator(".approval-card[data-state='pending']").wait_for()
    for text in ("first queued", "second queued", "third queued"):
        send(page, text)
    summary = page.get_by_role("button", name=re.compile(r"^3 queued"))
    summary.wait_for()
    assert summary.get_attribute("aria-expanded") == "false"
    assert page.locator(".intent-card[data-kind='queue']").count() == 0
    attention = page.get_by_role("button", name="Approval needed: Write approved.txt")
    assert attention.is_visible()
    # What needs the user comes first: above the queue and the composer.
    assert attention.bounding_box()["y"] < summary.bounding_box()["y"]
    page.evaluate("document.querySelector('[data-role=scroller]').scrollTop = 0")
    attention.click()
    card = page.locator(".approval-card[data-state='pending']")
    page.wait_for_function(
        """() => {
            const card = document.querySelector(".approval-card[data-state='pending']")
                .getBoundingClientRect();
            const view = document.querySelector('[data-role=scroller]').getBoundingClientRect();
            return card.top >= view.top && card.bottom <= view.bottom;
        }"""
    )
    assert page.evaluate("document.activeElement.textContent") == "Allow once"
    workbench.docs_screenshot(page, "phone")

    summary.click()
    assert summary.get_attribute("aria-expanded") == "true"
    assert page.locator(".intent-card[data-kind='queue'] .intent-text").all_inner_texts() == [
        "first queued",
        "second queued",
        "third queued",
    ]
    summary.click()
    assert page.locator(".intent-card[data-kind='queue']").count() == 0

    card.get_by_role("button", name="Allow once").click()
    wait_settled(page, 5)
    assert not attention.is_visible()
    assert page.locator(".queue-summary").count() == 0


# The controls of the workbench, each found by its role and accessible name.
NAMED_CONTROLS = [
    ("button", "Send"),
    ("textbox", "Message"),
    ("searchbox", "Search sessions"),
    ("button", "New project"),
    ("button", "Previous turn"),
    ("button", "Next turn"),
    ("button", "Keyboard shortcuts"),
    ("button", "Theme: System"),
    ("button", "Sign out"),
    ("link", "Markdown"),
    ("link", "JSON"),
    ("button", "Copy prompt"),
    ("button", "Edit prompt in the composer"),
    ("button", "Retry: send this prompt again"),
    ("button", "Copy answer"),
    ("button", "Copy python code"),
    ("button", "Show sessions of Demo project"),
    ("button", "+ New"),
]

FOCUS_VISIBLE = """() => {
    const el = document.activeElement;
    if (!el || el === document.body) return null;
    const visible = (node) => {
        const style = getComputedStyle(node);
        return (style.outlineStyle !== 'none' && parseFloat(style.outlineWidth) >= 1)
            || (style.boxShadow && style.boxShadow !== 'none');
    };
    // The message box shows its focus on the composer around it.
    const ok = visible(el) || (el.matches('.composer textarea') && visible(el.closest('.composer')));
    return { ok, what: el.outerHTML.slice(0, 100) };
}"""


def test_controls_have_names_focus_is_visible_and_axe_finds_nothing_serious(
    workbench: Workbench, session: Any
) -> None:
    page = workbench.new_page(viewport=DOCS_VIEWPORT, bypass_csp=True)
    open_session(page, session.pk)
    fill_session(page)
    for role, name in NAMED_CONTROLS:
        assert page.get_by_role(role, name=name, exact=True).count() >= 1, (role, name)
    unnamed = page.evaluate(
        """() => [...document.querySelectorAll(
                'button, a[href], input:not([type=hidden]), textarea, select, [tabindex]')]
            .filter((el) => el.getClientRects().length && !el.closest('[aria-hidden=true]'))
            .filter((el) => !(el.getAttribute('aria-label') || el.getAttribute('aria-labelledby')
                || el.labels?.length || el.textContent.trim()))
            .map((el) => el.outerHTML.slice(0, 120))"""
    )
    assert unnamed == []

    # Tab through the page: every stop shows where the focus is.
    page.evaluate("document.activeElement && document.activeElement.blur()")
    stops = []
    for _ in range(40):
        page.keyboard.press("Tab")
        stop = page.evaluate(FOCUS_VISIBLE)
        if stop:
            stops.append(stop)
    assert len(stops) >= 20
    assert [s["what"] for s in stops if not s["ok"]] == []

    problems: dict[str, Any] = {}
    problems["session, light"] = axe_violations(page)
    send(page, "approve this write")
    page.locator(".approval-card[data-state='pending']").wait_for()
    send(page, "queued behind it")
    page.locator(".intent-card[data-kind='queue']").wait_for()
    problems["approval and queue, light"] = axe_violations(page)
    page.get_by_role("button", name="Theme: System").click()
    page.get_by_role("button", name="Theme: Light").click()
    problems["approval and queue, dark"] = axe_violations(page)
    page.keyboard.press("Escape")  # not in a field: stops the turn; the queued message goes next
    wait_settled(page, 4)
    assert turn(page, 2).get_attribute("data-status") == "cancelled"
    problems["settled, dark"] = axe_violations(page)
    page.get_by_role("button", name="Keyboard shortcuts").click()
    page.get_by_role("dialog", name="Keyboard shortcuts").wait_for()
    problems["key map, dark"] = axe_violations(page)

    phone = workbench.new_page(viewport={"width": 420, "height": 860}, bypass_csp=True)
    open_session(phone, session.pk)
    wait_settled(phone, 4)
    problems["phone, light"] = axe_violations(phone)
    phone.get_by_role("button", name="Open sidebar").click()
    phone.locator("#sidebar .session.current").wait_for(state="visible")
    problems["phone sidebar, light"] = axe_violations(phone)

    project_page = workbench.new_page(bypass_csp=True)
    project_page.goto(f"/projects/{session.project.pk}/")
    project_page.wait_for_selector("#workbench[data-ready='true']")
    problems["project page"] = axe_violations(project_page)
    login = workbench.new_page(signed_in=False, bypass_csp=True)
    login.goto("/login/")
    problems["sign-in"] = axe_violations(login)

    found = {where: violations for where, violations in problems.items() if violations}
    assert found == {}, json.dumps(found, indent=1)
