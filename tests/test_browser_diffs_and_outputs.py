"""Diffs with line numbers and folded unchanged context; long tool outputs folded with "Show all".

The demo agent's `edit` appends a line to demo-edit.txt (a diff against what the file
held) after asking permission; `tool` lists the working directory (at most 20 names).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

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


@pytest.fixture
def session(user: Any) -> Any:
    project = factories.ProjectFactory(owner=user, name="Demo project")
    return factories.SessionFactory(project=project, title="")


def test_a_diff_has_line_numbers_and_folds_unchanged_lines(workbench: Workbench, session: Any) -> None:
    lines = [f"line {n}: unchanged" for n in range(1, 31)]
    (Path(session.project.path) / "demo-edit.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    page = workbench.new_page(viewport={"width": 1200, "height": 760})
    open_session(page, session.pk)
    send(page, "hello fast")
    wait_settled(page, 1)
    send(page, "edit fast")
    page.locator(".approval-card[data-state='pending']").wait_for()
    diff = turn(page).locator(".tool-card[data-tool-kind='edit'] .diff")
    # 30 unchanged lines and one added: three lines of context, the other 27 folded.
    fold = diff.get_by_role("button", name="Show 27 unchanged lines, 1 to 27")
    assert fold.inner_text() == "⋯ 27 unchanged lines"
    assert diff.locator(".line.ctx").count() == 3
    added = diff.locator(".line.add")
    assert added.locator(".ln-old").inner_text() == ""
    assert added.locator(".ln-new").inner_text() == "31"
    assert added.locator(".code").inner_text().strip() == "Hello from the hermesweb demo agent."
    assert diff.locator(".line.ctx .ln-new").all_inner_texts() == ["28", "29", "30"]
    assert diff.locator(".diff-stat").inner_text() == "+1 -0"
    page.locator(".approval-card[data-state='pending']").get_by_role("button", name="Allow once").click()
    settled = wait_settled(page, 2)
    assert settled.locator(".tool-card[data-tool-kind='edit']").get_attribute("data-status") == "completed"
    # The screen of settled turns: code above, the folded diff below.
    page.evaluate(
        "(() => { const s = document.querySelector('[data-role=scroller]');"
        " const code = document.querySelector('article.turn .code-block');"
        " s.scrollTop += code.getBoundingClientRect().top - s.getBoundingClientRect().top - 60; })()"
    )
    workbench.docs_screenshot(page, "settled-code-and-diff")
    diff = settled.locator(".tool-card[data-tool-kind='edit'] .diff")
    diff.get_by_role("button", name="Show 27 unchanged lines, 1 to 27").click()
    assert diff.locator(".line.ctx").count() == 30
    assert diff.locator(".line.ctx .ln-old").first.inner_text() == "1"
    # Line numbers are not part of what a reader copies.
    assert diff.locator(".ln").first.evaluate("(el) => getComputedStyle(el).userSelect") == "none"

    # Opened while the agent waits, it stays open as the card is redrawn (the updates after the answer).
    send(page, "edit fast")
    page.locator(".approval-card[data-state='pending']").wait_for()
    diff = turn(page).locator(".tool-card[data-tool-kind='edit'] .diff")
    diff.get_by_role("button", name="Show 28 unchanged lines, 1 to 28").click()
    assert diff.locator(".line.ctx").count() == 31
    page.locator(".approval-card[data-state='pending']").get_by_role("button", name="Allow once").click()
    settled = wait_settled(page, 3)
    assert settled.locator(".tool-card[data-tool-kind='edit']").get_attribute("data-status") == "completed"
    assert settled.locator(".tool-card[data-tool-kind='edit'] .diff .line.ctx").count() == 31


def test_a_long_tool_output_is_folded_with_show_all(workbench: Workbench, session: Any) -> None:
    cwd = Path(session.project.path)
    names = [f"file-{n:02d}.txt" for n in range(1, 21)]
    for name in names:
        (cwd / name).write_text("x", encoding="utf-8")
    page = workbench.new_page()
    open_session(page, session.pk)
    send(page, "tool fast")
    settled = wait_settled(page, 1)
    card = settled.locator(".tool-card[data-tool-kind='execute']")
    folded = card.locator(".tool-content .folded")
    show = folded.get_by_role("button", name="Show all (20 lines)")
    assert show.get_attribute("aria-expanded") == "false"
    text = folded.locator("pre").inner_text()
    assert text.splitlines()[:12] == names[:12]
    assert "file-20.txt" not in text
    show.click()
    less = folded.get_by_role("button", name="Show less")
    assert less.get_attribute("aria-expanded") == "true"
    assert folded.locator("pre").inner_text().splitlines() == names
    # The button keeps the keyboard focus across the redraw.
    assert page.evaluate("document.activeElement.textContent") == "Show less"
    less.click()
    assert "file-20.txt" not in folded.locator("pre").inner_text()
