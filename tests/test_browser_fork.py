"""Fork from the browser: the session's Fork button opens a new session that starts with the
parent's conversation, and whose first turn the agent answers with the parent's context.

The API's side is tests/test_fork.py; the demo agent's `recall` shows what the agent remembers.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from projects.models import Session
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

DESKTOP = {"width": 1200, "height": 760}
PHONE = {"width": 420, "height": 860}


@pytest.fixture
def project(user: Any) -> Any:
    return factories.ProjectFactory(owner=user, name="Demo project", agent="demo")


def test_fork_opens_a_new_session_that_remembers_the_conversation(workbench: Workbench, project: Any) -> None:
    parent = factories.SessionFactory(project=project, title="Plan the release")
    page = workbench.new_page(viewport=DESKTOP, bypass_csp=True)
    open_session(page, parent.pk)
    send(page, "fast remember the word MANGO-42")
    wait_settled(page, 1)

    fork_button = page.get_by_role("button", name="Fork this session")
    assert fork_button.inner_text() == "Fork"
    fork_button.click()
    page.wait_for_url(lambda url: re.search(r"/sessions/(\d+)/$", url) and not url.endswith(f"/{parent.pk}/"))
    fork_id = int(re.search(r"/sessions/(\d+)/$", page.url).group(1))  # type: ignore[union-attr]
    assert fork_id != parent.pk
    page.wait_for_selector("#workbench[data-ready='true']")
    page.wait_for_selector(".connection[data-state='live']")
    assert page.locator("[data-role=title]").inner_text() == "Plan the release (fork)"
    first = wait_settled(page, 1)
    assert "fast remember the word MANGO-42" in first.inner_text()
    assert Session.objects.get(pk=fork_id).forked_from_id == parent.pk

    send(page, "recall fast")
    answer = wait_settled(page, 2)
    assert "Your previous prompt was: fast remember the word MANGO-42" in answer.inner_text()
    assert axe_violations(page) == []
    workbench.screenshot(page, "fork-light")


def test_the_fork_button_fits_dark_and_phone(workbench: Workbench, project: Any) -> None:
    parent = factories.SessionFactory(project=project, title="Plan the release")
    for name, viewport, scheme in (("fork-dark", DESKTOP, "dark"), ("fork-phone", PHONE, "light")):
        page = workbench.new_page(viewport=viewport, color_scheme=scheme)
        open_session(page, parent.pk)
        button = page.get_by_role("button", name="Fork this session")
        button.wait_for(state="visible")
        box = button.bounding_box()
        assert box is not None and box["x"] + box["width"] <= viewport["width"]
        if name == "fork-dark":
            send(page, "fast hello")
            wait_settled(page, 1)
        workbench.screenshot(page, name)


def test_a_refused_fork_says_why_and_stays(workbench: Workbench, project: Any) -> None:
    parent = factories.SessionFactory(project=project, title="Never ran")
    page = workbench.new_page(viewport=DESKTOP)
    open_session(page, parent.pk)
    page.get_by_role("button", name="Fork this session").click()
    dialog = page.get_by_role("dialog")
    dialog.wait_for()
    assert "has not talked to its agent yet" in dialog.inner_text()
    dialog.get_by_role("button", name="OK").click()
    assert page.url.endswith(f"/sessions/{parent.pk}/")
    assert page.get_by_role("button", name="Fork this session").is_enabled()
    assert Session.objects.count() == 1
