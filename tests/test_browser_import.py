"""Importing the agent's own sessions from the browser: the dialog starts discovery, follows its job,
lists the agent's sessions in the project (those already in hermesweb marked, with a link), imports
one with its progress shown and opens it; a job that fails says why in words.

The agent sessions come from the real demo agent behind the workbench's runner: two are made by
turns in hermesweb, one of which is then deleted from hermesweb (the agent keeps it), and one is
a session file of the agent's that is spoilt once listed (its import fails with `load_failed`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from projects.models import Session
from runs.models import Run, RunSource
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

PHONE = {"width": 420, "height": 860}
FITS = (
    "(selector) => { const el = document.querySelector(selector); return el.scrollWidth <= el.clientWidth; }"
)
DESKTOP = {"width": 1200, "height": 760}


@pytest.fixture
def project(user: Any) -> Any:
    return factories.ProjectFactory(owner=user, name="Demo project", agent="demo")


def agent_session(workbench: Workbench, page: Any, project: Any, prompt: str) -> Session:
    """A session made by a turn in hermesweb: the demo agent keeps its own copy."""
    session = factories.SessionFactory(project=project, title="")
    open_session(page, session.pk)
    send(page, prompt)
    wait_settled(page, 1)
    session.refresh_from_db()
    assert session.agent_session_id
    return session


def agent_store(workbench: Workbench, agent_session_id: str) -> Path:
    """The demo agent's session directory (wherever the runner keeps this user's agent state)."""
    found = list(workbench.data_dir.rglob(f"sessions/{agent_session_id}.json"))
    assert len(found) == 1, found
    return found[0].parent


def old_agent_session(store: Path, like: str) -> Path:
    """A session file of the agent's (in the directory of `like`, another of its sessions)."""
    cwd = json.loads((store / f"{like}.json").read_text())["cwd"]
    sid = "old-notes-1"
    at = "2026-01-02T03:04:05.000Z"
    record = {"session_id": sid, "cwd": cwd, "created_at": at, "updated_at": at, "title": "Old notes"}
    path = store / f"{sid}.json"
    path.write_text(json.dumps({**record, "turns": 0, "context_tokens": 0, "history": []}))
    # As the agent would have written it: its own file (a root runner's agents run as an account
    # of their own, and this process's umask makes new files owner-only).
    like_stat = (store / f"{like}.json").stat()
    os.chown(path, like_stat.st_uid, like_stat.st_gid)
    return path


def open_import(page: Any) -> Any:
    page.get_by_role("button", name="Import agent sessions into Demo project").click()
    dialog = page.get_by_role("dialog", name="Import sessions into “Demo project”")
    dialog.wait_for()
    return dialog


def row(dialog: Any, agent_session_id: str, state: str = "") -> Any:
    """The dialog's entry of one agent session; with `state`, only while it is in that state."""
    where = f"[data-agent-session-id='{agent_session_id}']" + (f"[data-state='{state}']" if state else "")
    return dialog.locator(f".import-item{where}")


def test_the_agents_sessions_are_listed_and_one_is_imported_with_its_progress(
    workbench: Workbench, project: Any
) -> None:
    page = workbench.new_page(viewport=DESKTOP)
    kept = agent_session(workbench, page, project, "plan the release fast")
    gone = agent_session(workbench, page, project, "think about caching fast")
    gone_id = gone.agent_session_id
    Session.objects.filter(pk=gone.pk).delete()
    old_file = old_agent_session(agent_store(workbench, kept.agent_session_id), kept.agent_session_id)
    old_id = old_file.stem

    open_session(page, kept.pk)
    dialog = open_import(page)
    dialog.locator(".job-status[data-state='done']").wait_for()
    assert dialog.locator(".job-status").inner_text() == "3 sessions of the agent in this directory."
    items = dialog.get_by_role("list", name="Sessions of the agent in Demo project").get_by_role("listitem")
    assert items.count() == 3

    # The one already here: marked and linked, nothing to import.
    here = row(dialog, kept.agent_session_id)
    assert here.locator(".badge").inner_text() == "In hermesweb"
    link = here.get_by_role("link", name=re.compile(r"^Open "))
    assert link.get_attribute("href") == f"/sessions/{kept.pk}/"
    assert here.get_by_role("button", name=re.compile(r"^Import")).count() == 0
    assert row(dialog, gone_id).locator("time").count() == 1

    # A session the agent can no longer load (its file spoilt since it was listed): the row
    # says so, in words and with the job's own message, and offers to try again.
    old_file.write_text("{ not json")
    old = row(dialog, old_id)
    old.get_by_role("button", name="Import Old notes").click()
    row(dialog, old_id, "failed").wait_for()
    alert = old.get_by_role("alert")
    assert alert.locator("strong").inner_text() == "The agent could not load this session."
    assert old_id in alert.locator(".detail").inner_text()
    assert old.get_attribute("data-history").split()[0] == "pending"
    assert old.get_by_role("button", name="Try again: import Old notes").inner_text() == "Try again"
    page.mouse.move(1, 1)
    workbench.docs_screenshot(page, "import-dialog")

    # The real one: pending (a runner has not taken it yet) and on, then the imported session opens.
    target = row(dialog, gone_id)
    target.get_by_role("button", name=re.compile(r"^Import ")).click()
    dialog.locator(
        f".import-item[data-agent-session-id='{gone_id}']:is([data-state=pending], [data-state=running], "
        "[data-state=done])"
    ).wait_for()
    page.wait_for_url(re.compile(rf"/sessions/(?!{kept.pk}/)\d+/$"))
    page.wait_for_selector("#workbench[data-ready='true']")
    imported = Session.objects.get(project=project, agent_session_id=gone_id)
    assert page.url.endswith(f"/sessions/{imported.pk}/")
    wait_settled(page, 1)
    assert turn(page, 0).locator(".user-text").inner_text() == "think about caching fast"
    assert Run.objects.get(session=imported).source == RunSource.IMPORT

    # Listed again: both are in hermesweb now, and the imported one goes on with the agent.
    dialog = open_import(page)
    dialog.locator(".job-status[data-state='done']").wait_for()
    assert row(dialog, gone_id).get_by_role("link", name=re.compile(r"^Open ")).get_attribute("href") == (
        f"/sessions/{imported.pk}/"
    )
    dialog.get_by_role("button", name="Close").click()
    send(page, "hello fast")
    wait_settled(page, 2)


def test_a_discovery_that_fails_says_why(workbench: Workbench, user: Any) -> None:
    # An agent the runner does not know (the operator removed it since the project was made).
    project = factories.ProjectFactory(owner=user, name="Demo project", agent="retired-agent")
    page = workbench.new_page(viewport=DESKTOP)
    page.goto(f"/projects/{project.pk}/")
    page.wait_for_selector("#workbench[data-ready='true']")
    dialog = open_import(page)
    dialog.locator(".job-status[data-state='failed']").wait_for()
    assert dialog.locator(".job-status").inner_text() == "The agent\u2019s sessions could not be listed."
    alert = dialog.get_by_role("alert")
    assert (
        alert.locator("strong").inner_text() == "This project\u2019s agent is not configured on the server."
    )
    assert "retired-agent" in alert.locator(".detail").inner_text()
    assert dialog.get_by_role("list").count() == 0 or dialog.get_by_role("listitem").count() == 0
    # Asking again is safe, and fails the same way.
    dialog.get_by_role("button", name="List again").click()
    dialog.locator(".job-status[data-state='failed']").wait_for()


def test_the_import_dialog_on_a_phone(workbench: Workbench, project: Any) -> None:
    page = workbench.new_page(viewport=PHONE, bypass_csp=True)  # for axe-core
    kept = agent_session(workbench, page, project, "plan the release fast")
    gone = agent_session(workbench, page, project, "write the changelog for version two fast")
    Session.objects.filter(pk=gone.pk).delete()
    open_session(page, kept.pk)
    page.get_by_role("button", name="Open sidebar").click()
    dialog = open_import(page)
    dialog.locator(".job-status[data-state='done']").wait_for()
    assert dialog.get_by_role("listitem").count() == 2
    workbench.docs_screenshot(page, "import-dialog-phone")
    assert axe_violations(page) == []
    box = dialog.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    # Nothing in the dialog scrolls sideways; every Import and Open is inside it.
    assert page.evaluate(FITS, "dialog.import-dialog")
    for control in dialog.locator(".import-side a, .import-side button").all():
        inner = control.bounding_box()
        assert inner is not None and inner["x"] + inner["width"] <= box["x"] + box["width"]
