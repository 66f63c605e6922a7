"""The Files panel in the browser: the tree, the viewer, the editor and its conflicts, the git panel.

Opened from the header's Files toggle: directories first and lazy, a file highlighted, markdown
previewed, an image shown; Edit then Save writes the file (If-Match); a file changed on disk
meanwhile is a conflict with Reload / Overwrite, never overwritten silently; the git panel ticks
a file and commits it. Screenshots light, dark and phone. docs/workspace.md ("Files", "Git").
"""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests import factories
from tests.support.browser import (  # noqa: F401 - fixtures
    Workbench,
    browser,
    open_session,
    screenshots,
    wait_settled,
    workbench,
)
from tests.test_workspace_git import GIT_ENV, hand_to_agent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 420, "height": 860}
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGP8z8DAwMDAxMDAwMDAAAANHQEDasKb6QAAAABJRU5ErkJggg=="
)


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "safe.directory=*", *args],
        cwd=root,
        env=GIT_ENV,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@pytest.fixture
def project(user: Any) -> Any:
    project = factories.ProjectFactory(owner=user, name="Files demo", agent="demo")
    root = Path(project.path)
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text('def greet(name):\n    return f"hello {name}"\n')
    (root / "README.md").write_text("# Files demo\n\nSome **bold** words.\n\n```python\nprint(1)\n```\n")
    (root / "logo.png").write_bytes(PNG)
    (root / "notes.txt").write_text("first\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")
    hand_to_agent(root)
    return project


def open_files(workbench: Workbench, project: Any, **page_options: Any) -> Any:
    session = factories.SessionFactory(project=project, title="Look at the files")
    page = workbench.new_page(**page_options)
    open_session(page, session.pk)
    page.get_by_role("button", name="Files", exact=True).click()
    page.wait_for_selector("[data-role=files-tree] [data-path='src']")
    return page


def test_the_tree_lists_directories_first_and_opens_them_lazily(workbench: Workbench, project: Any) -> None:
    page = open_files(workbench, project, viewport=DESKTOP)
    top = page.locator("[data-role=files-tree] > li > .files-entry").evaluate_all(
        "els => els.map(e => e.dataset.path)"
    )
    assert top == ["src", "README.md", "logo.png", "notes.txt"]  # .git is the git panel's, not the tree's
    page.locator("[data-path='src']").click()
    page.wait_for_selector("[data-path='src/app.py']")
    page.locator("[data-path='src/app.py']").click()
    code = page.locator(".files-code code")
    code.wait_for()
    assert code.inner_text().startswith("def greet(name):")
    assert page.locator(".files-code .hljs-keyword").count() >= 1  # highlighted
    page.locator("[data-path='README.md']").click()
    page.wait_for_selector(".files-markdown strong")
    assert page.locator(".files-markdown strong").inner_text() == "bold"
    assert page.locator(".files-markdown .code-block").count() == 1
    workbench.screenshot(page, "files-markdown")
    page.locator("[data-path='logo.png']").click()
    page.wait_for_function(
        "() => { const img = document.querySelector('.files-image img');"
        " return img && img.complete && img.naturalWidth === 2 }"
    )


def test_edit_and_save_then_a_stale_file_is_a_conflict_never_overwritten(
    workbench: Workbench, project: Any
) -> None:
    page = open_files(workbench, project, viewport=DESKTOP)
    notes = Path(project.path) / "notes.txt"
    page.locator("[data-path='notes.txt']").click()
    page.get_by_role("button", name="Edit", exact=True).click()
    page.locator("[data-role=files-editor]").fill("second\n")
    page.get_by_role("button", name="Save", exact=True).click()
    page.wait_for_selector("[data-role=files-status]:has-text('Saved')")
    assert notes.read_text() == "second\n"

    # Someone else changes it while it is open in the editor.
    page.get_by_role("button", name="Edit", exact=True).click()
    page.locator("[data-role=files-editor]").fill("mine\n")
    notes.write_text("theirs\n")
    page.get_by_role("button", name="Save", exact=True).click()
    conflict = page.locator("[data-role=files-conflict]")
    conflict.wait_for()
    assert "changed on disk" in conflict.inner_text()
    assert notes.read_text() == "theirs\n"  # nothing overwritten without a choice
    workbench.docs_screenshot(page, "files-conflict")
    page.get_by_role("button", name="Overwrite", exact=True).click()
    page.wait_for_selector("[data-role=files-status]:has-text('Saved')")
    assert notes.read_text() == "mine\n"

    # Reload drops the edit and shows what is on disk.
    page.get_by_role("button", name="Edit", exact=True).click()
    page.locator("[data-role=files-editor]").fill("dropped\n")
    notes.write_text("on disk\n")
    page.get_by_role("button", name="Save", exact=True).click()
    page.get_by_role("button", name="Reload", exact=True).click()
    page.wait_for_selector(".files-code code:has-text('on disk')")
    assert notes.read_text() == "on disk\n"


def test_the_git_panel_commits_the_ticked_files(workbench: Workbench, project: Any, user: Any) -> None:
    user.first_name, user.email = "Grace", "grace@example.org"
    user.save()
    root = Path(project.path)
    (root / "notes.txt").write_text("changed\n")
    (root / "src" / "app.py").write_text("print('not ticked')\n")
    page = open_files(workbench, project, viewport=DESKTOP)
    panel = page.locator("[data-role=git-panel]")
    panel.wait_for()
    assert "main" in page.locator("[data-role=git-branch]").inner_text()
    assert "2 changed files" in panel.inner_text()
    workbench.docs_screenshot(page, "files-light")
    page.get_by_label("Commit notes.txt").check()
    page.get_by_role("button", name="Commit…", exact=True).click()
    page.locator("[data-role=git-message]").fill("Update the notes")
    page.get_by_role("button", name="Commit 1 file", exact=True).click()
    page.wait_for_selector("[data-role=git-panel]:has-text('1 changed file')")
    assert git(root, "log", "-1", "--format=%an <%ae> %s") == "Grace <grace@example.org> Update the notes\n"
    assert git(root, "status", "--porcelain") == " M src/app.py\n"


def test_a_tool_cards_path_opens_in_the_panel(workbench: Workbench, project: Any) -> None:
    page = open_files(workbench, project, viewport=DESKTOP)
    # A diff's path as the tool cards render it (static/js/diff.js): the absolute path in its title.
    page.evaluate(
        """(path) => { const s = document.createElement('span'); s.className = 'diff-path';
        s.title = path; s.textContent = 'app.py'; s.id = 'probe';
        document.querySelector('[data-role=transcript]').append(s); }""",
        str(Path(project.path) / "src" / "app.py"),
    )
    page.locator("#probe").click()
    page.wait_for_selector("[data-role=files-path]:has-text('src/app.py')")


def test_screens_dark_and_phone(workbench: Workbench, project: Any) -> None:
    (Path(project.path) / "notes.txt").write_text("changed\n")
    dark = open_files(workbench, project, viewport=DESKTOP, color_scheme="dark")
    dark.locator("[data-role=git-panel]").wait_for()
    dark.locator("[data-path='src']").click()
    dark.locator("[data-path='src/app.py']").click()
    dark.locator(".files-code .hljs-keyword").first.wait_for()
    workbench.docs_screenshot(dark, "files-dark")

    phone = open_files(workbench, project, viewport=PHONE)
    box = phone.locator("#files-panel").bounding_box()
    assert box is not None and box["width"] == PHONE["width"]  # it takes the screen
    workbench.docs_screenshot(phone, "files-phone")
    phone.locator("[data-path='README.md']").click()
    phone.wait_for_selector(".files-markdown strong")
    assert not phone.locator("[data-role=files-tree]").is_visible()
    workbench.screenshot(phone, "files-phone-viewer")
    phone.get_by_role("button", name="← Back", exact=True).click()
    assert phone.locator("[data-role=files-tree]").is_visible()
    phone.get_by_role("button", name="← Back", exact=True).click()
    assert phone.locator("#files-panel").is_hidden()


def test_at_completes_a_path_sent_as_a_mention_chip_the_agent_receives(
    workbench: Workbench, project: Any
) -> None:
    session = factories.SessionFactory(project=project, title="Mentions")
    page = workbench.new_page(viewport=DESKTOP)
    open_session(page, session.pk)
    box = page.locator(".composer textarea")
    box.click()
    box.press_sequentially("fast what is in @ap")
    options = page.locator("#mention-list [role=option]")
    options.first.wait_for()
    assert options.first.get_attribute("data-path") == "src/app.py"
    workbench.screenshot(page, "files-mention-list")
    box.press("Escape")
    assert page.locator("#mention-list").is_hidden()
    box.press_sequentially("p")  # typing on opens it again
    options.first.wait_for()
    box.press("ArrowDown")
    box.press("ArrowUp")
    box.press("Enter")  # chooses, does not send
    assert box.input_value() == "fast what is in @src/app.py "
    box.press_sequentially("please")
    box.press("Enter")
    turn = wait_settled(page, 1)
    chip = turn.locator(".mention-chip")
    assert chip.inner_text() == "@src/app.py"
    size = len((Path(project.path) / "src" / "app.py").read_bytes())
    assert f"Received file app.py (text/x-python, {size} bytes)." in turn.inner_text()
    workbench.screenshot(page, "files-mention-chip")
    chip.click()
    page.wait_for_selector("[data-role=files-path]:has-text('src/app.py')")


def test_a_worktree_sessions_panel_shows_its_worktree_light_dark_and_phone(
    workbench: Workbench, project: Any, tmp_path: Path, settings: Any
) -> None:
    from tests.support.worktrees import made
    from worktrees.services import do_create_worktree_session

    settings.HERMESWEB_WORKTREE_ROOT = str(tmp_path / "worktrees")
    repo = Path(project.path)
    session = do_create_worktree_session(project, title="Branch work", branch="wt/files", base="main")
    tree = made(session.pk)
    (tree / "branch-only.txt").write_text("made on the branch\n")
    (tree / "notes.txt").write_text("changed on the branch\n")
    main_before = git(repo, "status", "--porcelain")
    for name, viewport, scheme in (
        ("files-worktree-light", DESKTOP, "light"),
        ("files-worktree-dark", DESKTOP, "dark"),
        ("files-worktree-phone", PHONE, "light"),
    ):
        page = workbench.new_page(viewport=viewport, color_scheme=scheme)
        open_session(page, session.pk)
        # The empty state names the session's own tree, not the main checkout.
        named = page.locator("[data-role=empty-tree]", has_text=str(tree))
        named.wait_for()
        assert "wt/files" in named.inner_text() and str(repo) + " " not in named.inner_text()
        page.get_by_role("button", name="Files", exact=True).click()
        page.wait_for_selector("[data-role=files-tree] [data-path='branch-only.txt']")
        page.locator("[data-role=git-panel]:has-text('2 changed files')").wait_for()
        assert "wt/files" in page.locator("[data-role=git-branch]").inner_text()
        workbench.screenshot(page, name)
    page = workbench.new_page(viewport=DESKTOP)
    open_session(page, session.pk)
    page.get_by_role("button", name="Files", exact=True).click()
    page.locator("[data-role=git-panel]:has-text('2 changed files')").wait_for()
    page.get_by_label("Commit notes.txt").check()
    page.get_by_role("button", name="Commit…", exact=True).click()
    page.locator("[data-role=git-message]").fill("Notes on the branch")
    page.get_by_role("button", name="Commit 1 file", exact=True).click()
    page.wait_for_selector("[data-role=git-panel]:has-text('1 changed file')")
    assert git(tree, "log", "-1", "--format=%s", "wt/files") == "Notes on the branch\n"
    assert git(repo, "log", "-1", "--format=%s", "main") == "first\n"
    assert git(repo, "status", "--porcelain") == main_before
    assert (repo / "notes.txt").read_text() == "first\n"
