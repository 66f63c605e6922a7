"""The mode and model pickers beside the composer, in a real browser on the demo agent.

The demo agent reports two modes (`default`, `accept_edits`: edits without asking) and two
models, and answers `/status` with what it runs in (docs/demo-agent.md).
"""

from __future__ import annotations

from typing import Any

import pytest

from projects.models import Session
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

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

PHONE = {"width": 420, "height": 860}


@pytest.fixture
def session(user: Any) -> Any:
    project = factories.ProjectFactory(owner=user, name="Demo project")
    return factories.SessionFactory(project=project, title="Pickers")


def mode_picker(page: Any) -> Any:
    return page.get_by_label("Mode", exact=True)


def model_picker(page: Any) -> Any:
    return page.get_by_label("Model", exact=True)


def test_the_pickers_choose_the_mode_and_model_of_the_next_turn(workbench: Workbench, session: Any) -> None:
    page = workbench.new_page()
    open_session(page, session.pk)
    assert mode_picker(page).is_disabled()  # the agent reports its modes with the first turn
    send(page, "fast hello")
    wait_settled(page, 1)
    # The snapshot after the turn brings the modes: the picker fills in without a reload.
    page.wait_for_function(
        "() => document.querySelector('[data-role=mode-picker]').options.length === 2"
        " && !document.querySelector('[data-role=mode-picker]').disabled"
    )
    assert mode_picker(page).input_value() == "default"
    assert model_picker(page).input_value() == "demo-small"
    options = page.locator("#model-options option")
    assert [options.nth(i).get_attribute("value") for i in range(options.count())] == [
        "demo-small",
        "demo-large",
    ]

    mode_picker(page).select_option("accept_edits")
    page.wait_for_selector("[data-role=picker-status]:has-text('Mode: Accept edits')")
    model_picker(page).fill("demo-large")
    model_picker(page).press("Enter")  # picks the model; it does not send the composer's message
    page.wait_for_selector("[data-role=picker-status]:has-text('Model: demo-large')")
    session.refresh_from_db()
    assert (session.mode, session.model) == ("accept_edits", "demo-large")
    assert page.locator("article.turn").count() == 1

    send(page, "edit fast")
    settled = wait_settled(page, 2)
    assert settled.locator(".approval").count() == 0  # accept_edits: no approval asked
    send(page, "/status")
    assert "Mode: accept_edits · model: demo-large" in wait_settled(page, 3).inner_text()

    page.reload()
    page.wait_for_selector("#workbench[data-ready='true']")
    assert mode_picker(page).input_value() == "accept_edits"
    assert model_picker(page).input_value() == "demo-large"
    workbench.screenshot(page, "pickers-light")

    dark = workbench.new_page(color_scheme="dark")
    open_session(dark, session.pk)
    workbench.screenshot(dark, "pickers-dark")
    phone = workbench.new_page(viewport=PHONE)
    open_session(phone, session.pk)
    assert mode_picker(phone).is_visible() and model_picker(phone).is_visible()
    workbench.screenshot(phone, "pickers-phone")


def test_a_snapshot_that_changes_no_choice_leaves_the_lists_as_drawn(
    workbench: Workbench, session: Any
) -> None:
    # Every snapshot of the session reached the pickers, and each drew the lists again: one landing
    # while the user had the Mode list open pulled it from under them.
    page = workbench.new_page()
    open_session(page, session.pk)
    send(page, "fast hello")
    wait_settled(page, 1)
    page.wait_for_function("() => !document.querySelector('[data-role=mode-picker]').disabled")
    page.evaluate(
        """() => {
            const lists = '[data-role=mode-picker] option, #model-options option';
            for (const o of document.querySelectorAll(lists)) o.dataset.drawn = 'before';
            const shown = window.hermesweb.onSession;
            window.snapshotModes = [];
            window.hermesweb.onSession = (s) => { window.snapshotModes.push(s.mode); shown(s); };
        }"""
    )
    mode_picker(page).select_option("accept_edits")
    # The session's snapshot with the new mode has been shown: the same choices, the same lists.
    page.wait_for_function("() => window.snapshotModes.includes('accept_edits')")
    drawn = page.evaluate(
        "() => [...document.querySelectorAll('[data-role=mode-picker] option, #model-options option')]"
        ".map((o) => o.dataset.drawn || 'again')"
    )
    assert drawn == ["before"] * 4
    assert mode_picker(page).input_value() == "accept_edits"


def test_a_refused_choice_is_shown_and_the_picker_keeps_the_sessions_mode(
    workbench: Workbench, session: Any
) -> None:
    Session.objects.filter(pk=session.pk).update(
        available_modes=[{"id": "default", "name": "Default", "description": "Ask before edits."}],
        mode="default",
    )
    page = workbench.new_page()
    open_session(page, session.pk)
    # A mode the agent no longer offers (another tab's choice) cannot be saved: the API says why.
    page.evaluate(
        "() => { const s = document.querySelector('[data-role=mode-picker]');"
        " s.add(new Option('Gone', 'gone')); s.value = 'gone'; s.dispatchEvent(new Event('change')); }"
    )
    page.wait_for_selector("[data-role=picker-status][data-failed='true']:has-text('Unknown mode')")
    assert mode_picker(page).input_value() == "default"
    session.refresh_from_db()
    assert session.mode == "default"
