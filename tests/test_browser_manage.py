"""Managing from the browser: workflows (new, edit, launch, delete) and a project's settings.

Everything goes through the API the pages already use (projects/api.py).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from projects.models import Project, Workflow
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
def session(user: Any) -> Any:
    project = factories.ProjectFactory(owner=user, name="Demo project", agent="demo")
    return factories.SessionFactory(project=project, title="")


def test_create_edit_launch_and_delete_a_workflow(workbench: Workbench, session: Any) -> None:
    project = session.project
    page = workbench.new_page()
    open_session(page, session.pk)

    page.get_by_role("button", name="New workflow").click()
    dialog = page.get_by_role("dialog", name="New workflow in Demo project")
    dialog.get_by_label("Name", exact=True).fill("Review")
    template = dialog.get_by_label("Prompt template")
    template.fill("Review {path")
    assert "not closed" in dialog.get_by_role("status").inner_text()
    template.fill("Review {path} for {concern}, {{literally}}")
    assert dialog.get_by_role("status").inner_text() == "Fields asked at launch: path, concern"
    dialog.get_by_label("Mode (optional)").fill("accept_edits")  # one the demo agent offers
    dialog.get_by_role("button", name="Create").click()
    dialog.wait_for(state="detached")
    row = page.locator(".workflow", has_text="Review")
    row.wait_for()
    workflow = Workflow.objects.get(project=project)
    assert (workflow.name, workflow.agent_mode) == ("Review", "accept_edits")
    assert workflow.variables() == ["path", "concern"]

    # A template the server refuses: the dialog stays, with the server's reason.
    page.get_by_role("button", name="Edit workflow Review").click()
    dialog = page.get_by_role("dialog", name="Workflow “Review”")
    dialog.get_by_label("Prompt template").fill("Review {0.__class__}")
    dialog.get_by_role("button", name="Save").click()
    dialog.get_by_role("alert").filter(has_text=re.compile(r"\S")).wait_for()
    dialog.get_by_label("Name", exact=True).fill("Review code")
    dialog.get_by_label("Prompt template").fill("Review {path} fast")
    dialog.get_by_role("button", name="Save").click()
    dialog.wait_for(state="detached")
    page.locator(".workflow", has_text="Review code").wait_for()
    workflow.refresh_from_db()
    assert (workflow.name, workflow.prompt_template) == ("Review code", "Review {path} fast")

    # Launched: the form asks for the one field; the turn runs in a new session.
    page.locator(".workflow", has_text="Review code").get_by_role("button", name="Launch").click()
    launch = page.get_by_role("dialog", name="Launch “Review code”")
    launch.get_by_label("path").fill("src/")
    launch.get_by_role("button", name="Launch").click()
    page.wait_for_url(re.compile(r"/sessions/\d+/$"))
    settled = wait_settled(page, 1)
    assert settled.locator(".user-text").inner_text() == "Review src/ fast"

    page.get_by_role("button", name="Delete workflow Review code").click()
    page.get_by_role("dialog", name="Are you sure?").get_by_role("button", name="Delete").click()
    page.locator(".workflow").wait_for(state="detached")
    assert not Workflow.objects.filter(project=project).exists()


def test_edit_a_project(workbench: Workbench, session: Any) -> None:
    page = workbench.new_page()
    open_session(page, session.pk)
    page.get_by_role("button", name="Edit project Demo project").click()
    dialog = page.get_by_role("dialog", name="Project “Demo project”")
    # The agent is picked from the operator's agents (GET /api/agents), by their labels.
    picker = dialog.get_by_label("Agent (configured by the operator)")
    dialog.locator("[data-role=agent-picker] option", has_text="Demo agent (demo)").wait_for(state="attached")
    assert picker.input_value() == "demo"
    picker.select_option("demo")
    dialog.get_by_label("Name", exact=True).fill("Renamed project")
    dialog.get_by_label("While the agent is running, new messages").select_option("steer")
    workbench.screenshot(page, "manage-project")
    dialog.get_by_role("button", name="Save").click()
    dialog.wait_for(state="detached")
    page.locator(".project-name", has_text="Renamed project").wait_for()
    project = Project.objects.get(pk=session.project.pk)
    assert (project.name, project.running_default, project.agent) == ("Renamed project", "steer", "demo")

    # The new default is the composer's from now on: Steer while a run is going.
    send(page, "hold")  # held until Stop: the check below never races the turn's end
    page.wait_for_selector("[data-role=mode]:not([hidden]) button[data-mode='steer'][aria-pressed='true']")
    assert page.get_by_role("button", name="Steer", exact=True).count() >= 1
    page.get_by_role("button", name="Stop").click()
    wait_settled(page, 1, "cancelled")
