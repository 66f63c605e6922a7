"""Worktree sessions in the browser (docs/worktrees.md): start one from the sidebar with a
branch, see its branch badge with ahead/behind, merge it, and see a conflict shown plainly with
nothing changed. Screenshots light, dark and phone.
"""

from __future__ import annotations

import re
from pathlib import Path
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
    wait_settled,
    workbench,
)
from tests.support.worktrees import git, made, make_repo, state
from worktrees.models import Worktree
from worktrees.services import do_create_worktree_session

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

DESKTOP = {"width": 1200, "height": 760}
PHONE = {"width": 420, "height": 860}


@pytest.fixture
def project(user: Any, tmp_path: Path, settings: Any) -> Any:
    settings.HERMESWEB_WORKTREE_ROOT = str(tmp_path / "worktrees")
    project = factories.ProjectFactory(owner=user, name="Repo", agent="demo")
    make_repo(project.path)
    return project


def test_start_a_worktree_session_see_its_branch_and_merge_it(workbench: Workbench, project: Any) -> None:
    page = workbench.new_page(viewport=DESKTOP)
    page.goto(f"/projects/{project.pk}/")
    page.wait_for_selector("#workbench[data-ready='true']")
    page.get_by_role("button", name="New session in its own worktree in Repo").click()
    dialog = page.get_by_role("dialog", name="New session in its own worktree")
    dialog.locator("input[name=branch]").fill("no..good")
    dialog.get_by_role("button", name="Start session").click()
    dialog.get_by_text("is not a valid branch name").wait_for()
    dialog.locator("input[name=branch]").fill("fix/typo")
    dialog.get_by_role("button", name="Start session").click()
    page.wait_for_url(re.compile(r"/sessions/\d+/$"))
    session = Session.objects.get(worktree__branch="fix/typo")
    page.wait_for_selector(".connection[data-state='live']")
    badge = page.locator("[data-role=worktree] [data-role=worktree-badge]")
    assert badge.inner_text().strip() == "⎇ fix/typo"
    assert badge.get_attribute("data-state") == "pending"

    send(page, "fast hello")
    wait_settled(page, 1)
    tree = Path(Worktree.objects.get(session=session).path)
    (tree / "shared.txt").write_text("one\nTWO\nthree\n")  # as an agent's edit would
    page.evaluate("window.dispatchEvent(new Event('focus'))")
    page.wait_for_selector("[data-role=worktree] [data-role=worktree-badge][data-state=ready]")
    page.locator("[data-role=worktree] .counts", has_text="•").wait_for()
    sidebar = page.locator(f".session[data-session-id='{session.pk}'] .worktree-badge")
    assert "fix/typo" in sidebar.inner_text()
    workbench.screenshot(page, "worktree-session-light")

    page.get_by_role("button", name="Merge", exact=True).click()
    merge = page.get_by_role("dialog", name="Merge fix/typo into main")
    merge.locator("textarea[name=message]").fill("Fix the typo")
    merge.get_by_role("button", name="Merge", exact=True).click()
    result = page.get_by_text(re.compile(r"Merged fix/typo into main: main is now at [0-9a-f]{10}\."))
    result.wait_for()
    workbench.screenshot(page, "worktree-merged-light")
    assert (Path(project.path) / "shared.txt").read_text() == "one\nTWO\nthree\n"
    assert git(project.path, "log", "-1", "--format=%s") == "Fix the typo"


def test_a_conflict_is_shown_plainly_and_changes_nothing_light_dark_and_phone(
    workbench: Workbench, project: Any
) -> None:
    repo = Path(project.path)
    session = do_create_worktree_session(project, title="Refactor", branch="refactor", base="main")
    tree = made(session.pk)
    (tree / "shared.txt").write_text("one\ntwo by the session\nthree\n")
    (repo / "shared.txt").write_text("one\ntwo on main\nthree\n")
    git(repo, "commit", "--quiet", "-am", "main moved")
    before = state(repo)
    for name, viewport, scheme in (
        ("worktree-conflict-light", DESKTOP, "light"),
        ("worktree-conflict-dark", DESKTOP, "dark"),
        ("worktree-conflict-phone", PHONE, "light"),
    ):
        page = workbench.new_page(viewport=viewport, color_scheme=scheme)
        open_session(page, session.pk)
        badge = page.locator("[data-role=worktree] [data-role=worktree-badge]")
        badge.wait_for()
        assert badge.inner_text().split() == ["⎇", "refactor", "↓1", "•"]
        merge_button = page.get_by_role("button", name="Merge", exact=True)
        merge_button.wait_for(state="visible")
        box = merge_button.bounding_box()
        assert box is not None and box["x"] + box["width"] <= viewport["width"]
        if name == "worktree-conflict-phone":
            workbench.screenshot(page, "worktree-session-phone")
        merge_button.click()
        dialog = page.get_by_role("dialog", name="Merge refactor into main")
        dialog.get_by_role("button", name="Merge", exact=True).click()
        outcome = dialog.locator("[data-role=merge-outcome]")
        outcome.get_by_text("Conflicts — nothing was merged, nothing changed:").wait_for()
        assert outcome.locator("li").all_inner_texts() == ["shared.txt"]
        workbench.screenshot(page, name)
        assert state(repo) == before
        assert (tree / "shared.txt").read_text() == "one\ntwo by the session\nthree\n"


def test_a_workflow_launches_into_a_new_session_in_its_own_worktree(
    workbench: Workbench, project: Any
) -> None:
    factories.WorkflowFactory(project=project, name="Review code", prompt_template="fast review {what}")
    page = workbench.new_page(viewport=DESKTOP)
    page.goto(f"/projects/{project.pk}/")
    page.wait_for_selector("#workbench[data-ready='true']")
    page.locator(".workflow", has_text="Review code").get_by_role("button", name="Launch").click()
    launch = page.get_by_role("dialog", name="Launch “Review code”")
    launch.locator("textarea[name=what]").fill("the parser")
    launch.get_by_label("New session in its own worktree").check()
    launch.get_by_label("Branch of the new worktree").fill("review/parser")
    launch.get_by_role("button", name="Launch").click()
    page.wait_for_url(re.compile(r"/sessions/\d+/$"))
    badge = page.locator("[data-role=worktree] [data-role=worktree-badge]")
    badge.wait_for()
    assert badge.inner_text().strip().startswith("⎇ review/parser")
    wait_settled(page, 1)
    session = Session.objects.get(worktree__branch="review/parser")
    assert Path(Worktree.objects.get(session=session).path).is_dir()
