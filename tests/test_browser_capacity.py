"""Waiting is visible (issue 43): a queued turn says why it waits, in the sidebar and the header —
for one of the user's slots, or for a runner with the labels its project needs. Light, dark and
phone (docs/runner.md, "Fairness" and "Placement")."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from runs.models import Runner, RunStatus
from tests import factories
from tests.support import procs
from tests.support.browser import Workbench, browser, open_session, screenshots, workbench  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]


def badge(page: Any, session_id: int) -> Any:
    return page.locator(f".session[data-session-id='{session_id}'] .live-state.waiting")


def test_waiting_turns_say_why_in_the_sidebar_and_the_header_light_dark_and_phone(
    workbench: Workbench, user: Any
) -> None:
    # The test's runner serves the test's root and offers no label: what "no runner" is read against.
    procs.wait_for(lambda: Runner.objects.alive().filter(pk="browser").exists(), 60, what="the runner")
    project = factories.ProjectFactory(owner=user, name="Web app")
    pinned = factories.ProjectFactory(
        owner=user, name="Models", path=project.path, required_labels=["host=build-1"]
    )
    # Four turns another runner (on another host) holds: the user's four slots are taken.
    Runner.objects.create(id="elsewhere", host="elsewhere.invalid", pid=1)
    held = {"lease_owner": "elsewhere", "lease_expires_at": timezone.now() + timedelta(hours=1)}
    for i in range(4):
        session = factories.SessionFactory(project=project, title=f"Busy turn {i + 1}")
        factories.RunFactory(session=session, status=RunStatus.RUNNING, **held)
    for_slot = factories.SessionFactory(project=project, title="Write the changelog")
    factories.RunFactory(session=for_slot, status=RunStatus.QUEUED)
    # The test's runner offers no label: this project's turn waits for a runner with host=build-1.
    for_runner = factories.SessionFactory(project=pinned, title="Train the tokenizer")
    factories.RunFactory(session=for_runner, status=RunStatus.QUEUED)

    for scheme in ("light", "dark"):
        page = workbench.new_page(color_scheme=scheme)
        open_session(page, for_slot.pk)
        badge(page, for_slot.pk).wait_for()
        assert badge(page, for_slot.pk).inner_text() == "waiting"
        assert page.get_by_role("img", name="waiting: 4 of your turns are running").count() == 1
        status = page.locator("[data-role=run-status]")
        page.wait_for_function(
            "() => document.querySelector('[data-role=run-status]').textContent"
            " === 'waiting: 4 of your turns are running'"
        )
        assert status.get_attribute("data-status") == "waiting"
        workbench.screenshot(page, f"capacity-waiting-{scheme}")
        # The project dialog shows (and edits) the labels the project's turns need.
        page.get_by_role("button", name="Edit project Models").click()
        labels = page.locator("dialog[open] input[name=required_labels]")
        assert labels.input_value() == "host=build-1"
        workbench.screenshot(page, f"capacity-project-labels-{scheme}")
        labels.fill("host=build-1, gpu")
        page.locator("dialog[open]").get_by_role("button", name="Save").click()
        page.wait_for_function("() => !document.querySelector('dialog[open]')")
        procs.wait_for(
            lambda: type(pinned).objects.get(pk=pinned.pk).required_labels == ["gpu", "host=build-1"],
            30,
            what="the labels saved",
        )
        type(pinned).objects.filter(pk=pinned.pk).update(required_labels=["host=build-1"])

    phone = workbench.new_page(viewport={"width": 420, "height": 860})
    open_session(phone, for_runner.pk)
    phone.wait_for_function(
        "() => document.querySelector('[data-role=run-status]').textContent"
        " === 'waiting for a runner with host=build-1'"
    )
    workbench.screenshot(phone, "capacity-waiting-phone")
    phone.get_by_role("button", name="Open sidebar").click()
    badge(phone, for_runner.pk).wait_for()
    assert badge(phone, for_runner.pk).inner_text() == "no runner"
    assert phone.get_by_role("img", name="waiting for a runner with host=build-1").count() == 1
    workbench.screenshot(phone, "capacity-waiting-phone-sidebar")
