"""A workflow's automations in the browser (issue 42): triggers with their next times and an
on/off switch, adding a schedule or a webhook (its URL shown once), the firing history with a
failed or skipped firing visible at a glance; screenshots light, dark and phone.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from automations import services
from automations.models import Firing, FiringOutcome, Trigger
from tests import factories
from tests.support.browser import (  # noqa: F401 - fixtures
    Workbench,
    browser,
    open_session,
    screenshots,
    workbench,
)
from tests.support.procs import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]


@pytest.fixture
def session(user: Any) -> Any:
    project = factories.ProjectFactory(owner=user, name="Demo project", agent="demo")
    return factories.SessionFactory(project=project, title="Nightly")


def with_history(session: Any) -> Any:
    workflow = factories.WorkflowFactory(
        project=session.project, name="Nightly deps", prompt_template="fast deps"
    )
    trigger = services.do_create_trigger(
        workflow, kind="schedule", cron="0 7 * * 1-5", timezone_name="Europe/Berlin"
    ).trigger
    now = timezone.now()
    Firing.objects.create(
        trigger=trigger, planned_at=now - timedelta(days=2), outcome=FiringOutcome.LAUNCHED, session=session
    )
    Firing.objects.create(
        trigger=trigger,
        planned_at=now - timedelta(days=1),
        outcome=FiringOutcome.FAILED,
        reason="project_archived: This project is archived; restore it to send.",
    )
    Firing.objects.create(
        trigger=trigger,
        planned_at=now - timedelta(hours=1),
        outcome=FiringOutcome.SKIPPED_MISSED,
        reason="no scheduler was running",
    )
    return workflow


def open_automations(page: Any, workflow: Any) -> Any:
    page.get_by_role("button", name=f"Automations of workflow {workflow.name}").click()
    dialog = page.get_by_role("dialog", name=f"Automations of “{workflow.name}”")
    dialog.locator(".firing").first.wait_for()
    return dialog


def test_a_workflows_triggers_switch_and_history(workbench: Workbench, session: Any) -> None:
    workflow = with_history(session)
    page = workbench.new_page()
    open_session(page, session.pk)
    dialog = open_automations(page, workflow)

    row = dialog.locator(".trigger").first
    assert "Cron 0 7 * * 1-5 (Europe/Berlin)" in row.inner_text()
    assert re.search(r"next: \S", row.inner_text())
    assert dialog.locator(".firing").count() == 3
    assert dialog.locator(".firing-failed .firing-outcome").inner_text() == "failed"
    assert dialog.locator(".firing-skipped_missed").count() == 1
    link = dialog.locator(".firing-launched a")
    assert link.get_attribute("href") == f"/sessions/{session.pk}/"
    workbench.docs_screenshot(page, "automations")

    # Off, then on again: the switch writes through the API.
    row.get_by_role("checkbox").uncheck()
    wait_for(lambda: not Trigger.objects.get().enabled, 10, what="the switch to turn the trigger off")

    # A bad cron: the server's reason; a webhook: its URL once.
    dialog.get_by_label("Cron (minute hour day month weekday)").fill("61 * * * *")
    dialog.get_by_role("button", name="Add trigger").click()
    dialog.get_by_role("alert").filter(has_text=re.compile(r"\S")).wait_for()
    dialog.get_by_label("Fires").select_option("webhook")
    dialog.get_by_role("button", name="Add trigger").click()
    url = dialog.locator("[data-role=webhook-url]")
    url.wait_for()
    assert "/api/hooks/hw_hook_" in url.input_value()
    assert Trigger.objects.filter(kind="webhook").count() == 1


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("automations-dark", {"color_scheme": "dark"}),
        ("automations-phone", {"viewport": {"width": 420, "height": 860}}),
    ],
)
def test_the_automations_dialog_in_dark_and_on_a_phone(
    workbench: Workbench, session: Any, name: str, options: dict[str, Any]
) -> None:
    workflow = with_history(session)
    page = workbench.new_page(**options)
    open_session(page, session.pk)
    if options.get("viewport"):
        page.get_by_role("button", name="Open sidebar").click()  # the phone's sidebar is a drawer
    dialog = open_automations(page, workflow)
    assert dialog.locator(".firing").count() == 3
    workbench.docs_screenshot(page, name)
