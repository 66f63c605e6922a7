"""The composer's hint (its placeholder) on a phone: shown whole on one line, in light and dark,
on a project's page and a session's, never wrapped and clipped by the message box."""

from __future__ import annotations

from typing import Any

import pytest

from tests import factories
from tests.support.browser import (  # noqa: F401 - fixtures
    Workbench,
    browser,
    open_session,
    screenshots,
    workbench,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

PHONE = {"width": 390, "height": 844}

# The placeholder's width in the textarea's own font, against the room its content box has.
HINT_ROOM = """() => {
    const box = document.querySelector('.composer textarea');
    const style = getComputedStyle(box);
    const context = document.createElement('canvas').getContext('2d');
    context.font = `${style.fontStyle} ${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
    const room = box.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    return { hint: box.placeholder, width: context.measureText(box.placeholder).width, room };
}"""


@pytest.fixture
def project(user: Any) -> Any:
    return factories.ProjectFactory(owner=user, name="Demo project")


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_the_composer_hint_fits_on_a_phone_on_a_project_page(
    workbench: Workbench, project: Any, scheme: str
) -> None:
    page = workbench.new_page(viewport=PHONE, color_scheme=scheme)
    page.goto(f"/projects/{project.pk}/")
    page.wait_for_selector("#workbench[data-ready='true']")

    workbench.screenshot(page, f"composer-hint-phone-{scheme}")

    room = page.evaluate(HINT_ROOM)
    assert "/" in room["hint"]  # still says how to reach the commands
    assert room["width"] <= room["room"], room


def test_the_composer_hint_fits_on_a_phone_on_a_session_page(workbench: Workbench, project: Any) -> None:
    session = factories.SessionFactory(project=project, title="")
    page = workbench.new_page(viewport=PHONE)
    open_session(page, session.pk)

    room = page.evaluate(HINT_ROOM)
    assert room["width"] <= room["room"], room
