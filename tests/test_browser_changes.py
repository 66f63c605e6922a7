"""The workspace in the workbench: each turn's "N files changed", its changes and the session's,
rewinding a turn's files after a confirmation that lists them, the rewind journaled in the
transcript with an Undo that works; conflicts and a busy session said plainly (docs/workspace.md).

The demo agent edits through real shell commands (tests/support/workspace.py's runner).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from runs.journal.payloads import payload_errors
from runs.models import JournalEvent, Run, RunSource
from tests import factories
from tests.support.browser import (  # noqa: F401 - fixtures
    Workbench,
    browser,
    open_session,
    screenshots,
    send,
)
from tests.support.workspace import SANDBOX

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

MINUS = "\u2212"  # the summary's minus sign
PHONE = {"width": 420, "height": 860}
LONG = "".join(f"line {n}\n" for n in range(1, 41))
# Every summary request the page makes, recorded as it is made.
RECORD_SUMMARIES = """
window.__summaries = [];
const realFetch = window.fetch;
window.fetch = (input, init) => {
  const url = typeof input === 'string' ? input : input.url;
  if (url.includes('/changes/summary')) window.__summaries.push(url);
  return realFetch(input, init);
};
"""


@pytest.fixture
def bench(browser: Any, screenshots: Path, user: Any, tmp_path: Path) -> Iterator[Workbench]:
    """The workbench, its demo agent taking the test-only `shell <command>`."""
    spec = dataclasses.asdict(settings.HERMESWEB_AGENTS["demo"])
    spec.pop("name")
    spec["env"] = {**spec["env"], "HERMESWEB_DEMO_DELAY": "0.002", "HERMESWEB_DEMO_SHELL": "1"}
    spec["sandbox"] = SANDBOX
    (tmp_path / "data").mkdir()
    (tmp_path / "logs").mkdir()
    work = Workbench(
        browser=browser,
        user=user,
        data_dir=tmp_path / "data",
        log_dir=tmp_path / "logs",
        screenshot_dir=screenshots,
        settings_env={"HERMESWEB_AGENTS": json.dumps({"demo": spec})},
    )
    work.start()
    try:
        yield work
    finally:
        work.stop()
        print(work.logs())
    broken = [
        line for line in work.console if line.startswith("[pageerror]") or "Content Security Policy" in line
    ]
    assert not broken, "\n".join(broken)


@pytest.fixture
def session(user: Any) -> Any:
    project = factories.ProjectFactory(owner=user, name="Demo project", agent="demo")
    root = Path(project.path)
    (root / "a.txt").write_text("zero\n")
    (root / "long.txt").write_text(LONG)
    return factories.SessionFactory(project=project, title="Changes")


def turns(page: Any) -> Any:
    return page.locator("article.turn:not([data-source='workspace'])")


def wait_turn(page: Any, count: int, status: str = "completed") -> Any:
    """Wait for `count` turns (rewinds not counted), the last one ended with `status`."""
    page.wait_for_function(
        """([count, status]) => {
            const turns = document.querySelectorAll("article.turn:not([data-source='workspace'])");
            return turns.length === count && turns[count - 1].dataset.status === status;
        }""",
        arg=[count, status],
        timeout=90_000,
    )
    return turns(page).nth(count - 1)


def restored_items(page: Any) -> Any:
    return page.locator("article.turn[data-source='workspace'] .files-restored")


def test_a_turn_shows_what_it_changed_and_rewinding_it_is_journaled_with_an_undo(
    bench: Workbench, session: Any
) -> None:
    root = Path(session.project.path)
    page = bench.new_page()
    page.add_init_script(RECORD_SUMMARIES)
    open_session(page, session.pk)

    # An edit in the middle of a long file, a rewritten file and a new one: one turn.
    send(
        page,
        "shell printf 'one\\n' > a.txt && echo new > b.txt && sed -i 's/^line 20$/line twenty/' long.txt",
    )
    first = wait_turn(page, 1)
    summary = first.locator(".turn-changes")
    summary.wait_for()
    assert summary.text_content() == f"3 files changed, +3 {MINUS}2"

    # Its changes: the files, then each diff numbered from its hunk, the unchanged lines folded.
    summary.click()
    dialog = page.get_by_role("dialog", name="Changes of this turn")
    dialog.locator(".changes-file").nth(2).wait_for()
    assert dialog.locator(".changes-list .changes-path").all_inner_texts() == ["a.txt", "b.txt", "long.txt"]
    long = dialog.locator(".changes-file[data-path='long.txt']")
    assert long.locator(".line.del .code").inner_text().strip() == "line 20"
    assert long.locator(".line.add .code").inner_text().strip() == "line twenty"
    assert long.locator(".line.add .ln-new").inner_text() == "20"
    assert long.locator(".line.fold").first.inner_text() == "⋯ 16 unchanged lines"
    assert dialog.locator(".changes-file[data-path='b.txt'] .badge").inner_text() == "new file"
    bench.docs_screenshot(page, "changes-turn")
    dialog.get_by_role("button", name="Close", exact=True).click()

    # A second turn: its count appears when it ends; a turn that changed nothing shows none.
    send(page, "shell echo two >> a.txt")
    second = wait_turn(page, 2)
    second.locator(".turn-changes").wait_for()
    assert second.locator(".turn-changes").text_content() == f"1 file changed, +1 {MINUS}0"
    send(page, "shell true")
    third = wait_turn(page, 3)
    third.locator(".prompt-actions [data-action='rewind']").wait_for(state="attached")
    page.wait_for_function("() => window.__summaries.length === 3")
    assert third.locator(".turn-changes").count() == 0

    # The session's Changes: everything since its first turn.
    page.get_by_role("button", name="Changes: what this session changed in the project's files").click()
    dialog = page.get_by_role("dialog", name="Changes of this session")
    dialog.locator(".changes-file").nth(2).wait_for()
    assert dialog.locator(".changes-stat").text_content() == f"3 files changed, +4 {MINUS}2"
    bench.docs_screenshot(page, "changes-session")
    dialog.get_by_role("button", name="Close", exact=True).click()

    # A reload asks for every turn's summary in one request.
    page.evaluate("() => (window.__summaries = [])")
    page.reload()
    page.wait_for_selector("#workbench[data-ready='true']")
    turns(page).nth(1).locator(".turn-changes").wait_for()
    assert page.evaluate("() => window.__summaries.length") == 1

    # Rewind the first turn: the confirmation lists the files.
    turns(page).first.get_by_role("button", name="Rewind files to before this turn").click()
    confirm = page.get_by_role("dialog", name="Rewind files to before this turn?")
    confirm.locator(".rewind-paths.restoring li").first.wait_for()
    assert confirm.locator(".rewind-paths.restoring li").all_inner_texts() == ["a.txt", "b.txt", "long.txt"]
    assert confirm.locator(".rewind-conflicts").is_hidden()
    bench.docs_screenshot(page, "rewind-confirm")
    confirm.get_by_role("button", name="Rewind files").click()
    item = restored_items(page).first
    item.wait_for()
    assert item.locator("strong").inner_text() == "Files restored to before turn 1 — 3 files"
    assert (root / "a.txt").read_text() == "zero\n" and not (root / "b.txt").exists()
    assert (root / "long.txt").read_text() == LONG

    # Journaled: a workspace run of its own, one event and one done, to its declaration.
    record = Run.objects.get(session=session, source=RunSource.WORKSPACE)
    events = list(JournalEvent.objects.filter(run=record).order_by("seq").values_list("type", "payload"))
    assert [t for t, _ in events] == ["run.started", "files.restored", "done"]
    assert payload_errors("files.restored", events[1][1]) == []
    assert events[1][1]["turn"] == 1 and events[1][1]["count"] == 3

    # Undo puts them back, journaled in turn.
    item.get_by_role("button", name="Undo: Files restored to before turn 1 — 3 files").click()
    undone = restored_items(page).nth(1)
    undone.wait_for()
    assert undone.locator("strong").inner_text() == "Rewind undone — 3 files put back"
    assert (root / "a.txt").read_text() == "one\ntwo\n" and (root / "b.txt").read_text() == "new\n"
    undone.scroll_into_view_if_needed()
    bench.docs_screenshot(page, "rewind-journaled")

    # Something else changed a file since: the confirmation says which, and asks to force.
    (root / "a.txt").write_text("edited outside\n")
    turns(page).nth(1).get_by_role("button", name="Rewind files to before this turn").click()
    confirm = page.get_by_role("dialog", name="Rewind files to before this turn?")
    confirm.locator(".rewind-conflicts li").first.wait_for()
    assert confirm.locator(".rewind-conflicts li").all_inner_texts() == ["a.txt"]
    bench.screenshot(page, "rewind-conflict")
    confirm.get_by_role("button", name="Rewind files anyway").click()
    restored_items(page).nth(2).wait_for()
    assert (root / "a.txt").read_text() == "one\n"
    assert restored_items(page).nth(2).locator(".badge").inner_text() == "forced"


def test_rewind_is_refused_plainly_while_a_turn_runs(bench: Workbench, session: Any) -> None:
    root = Path(session.project.path)
    page = bench.new_page()
    open_session(page, session.pk)
    send(page, "shell echo one > a.txt")
    first = wait_turn(page, 1)
    send(page, "hold")
    wait_turn(page, 2, "running")
    first.get_by_role("button", name="Rewind files to before this turn").click()
    told = page.get_by_role("dialog", name="Cannot rewind now")
    told.wait_for()
    assert "A turn of this session is running" in told.inner_text()
    assert (root / "a.txt").read_text() == "one\n"
    told.get_by_role("button", name="OK").click()
    (root / "hold-release").write_text("")
    wait_turn(page, 2)


def test_changes_and_rewind_in_the_dark_and_on_a_phone(bench: Workbench, session: Any) -> None:
    page = bench.new_page(color_scheme="dark")
    open_session(page, session.pk)
    send(
        page,
        "shell printf 'one\\n' > a.txt && echo new > b.txt && sed -i 's/^line 20$/line twenty/' long.txt",
    )
    first = wait_turn(page, 1)
    first.locator(".turn-changes").wait_for()
    bench.screenshot(page, "changes-summary-dark")
    first.locator(".turn-changes").click()
    page.get_by_role("dialog", name="Changes of this turn").locator(".changes-file").nth(2).wait_for()
    bench.screenshot(page, "changes-turn-dark")
    page.keyboard.press("Escape")
    first.get_by_role("button", name="Rewind files to before this turn").click()
    page.get_by_role("dialog", name="Rewind files to before this turn?").locator(
        ".rewind-paths li"
    ).first.wait_for()
    bench.screenshot(page, "rewind-confirm-dark")
    page.keyboard.press("Escape")

    phone = bench.new_page(viewport=PHONE)
    open_session(phone, session.pk)
    wait_turn(phone, 1).locator(".turn-changes").wait_for()
    bench.screenshot(phone, "changes-summary-phone")
    phone.get_by_role("button", name="Changes: what this session changed in the project's files").click()
    phone.get_by_role("dialog", name="Changes of this session").locator(".changes-file").nth(2).wait_for()
    bench.screenshot(phone, "changes-session-phone")
    phone.get_by_role("button", name="Close", exact=True).click()
    turns(phone).first.get_by_role("button", name="Rewind files to before this turn").click()
    phone.get_by_role("dialog", name="Rewind files to before this turn?").locator(
        ".rewind-paths li"
    ).first.wait_for()
    bench.screenshot(phone, "rewind-confirm-phone")


def test_a_fold_between_hunks_opens_with_the_lines_as_the_turn_left_them(
    bench: Workbench, session: Any
) -> None:
    root = Path(session.project.path)
    (root / "long.txt").write_text("".join(f"line {n}\n" for n in range(1, 2101)))
    page = bench.new_page()
    open_session(page, session.pk)
    send(page, "shell sed -i -e 's/^line 5$/line five/' -e 's/^line 2090$/line ninety/' long.txt")
    first = wait_turn(page, 1)
    # Changed on disk after the turn: the fold shows the turn's end checkpoint, not this.
    (root / "long.txt").write_text("rewritten since\n")
    first.locator(".turn-changes").click()
    dialog = page.get_by_role("dialog", name="Changes of this turn")
    long = dialog.locator(".changes-file[data-path='long.txt']")
    folds = long.locator(".line.fold .fold-button")
    folds.first.wait_for()
    assert folds.all_inner_texts() == ["⋯ 1 unchanged line", "⋯ 2078 unchanged lines"]
    folds.nth(1).click()  # lines 9..2086: a page of 2,000, then a fold for the rest
    long.locator(".line.ctx .ln-new", has_text="2008").wait_for()
    rows = long.locator(".line.ctx").evaluate_all(
        "els => els.map(e => [e.querySelector('.ln-old').textContent, e.querySelector('.ln-new').textContent,"
        " e.querySelector('.code').textContent])"
    )
    assert ["9", "9", "line 9\n"] in rows and ["2008", "2008", "line 2008\n"] in rows
    assert ["2009", "2009", "line 2009\n"] not in rows
    rest = long.locator(".line.fold .fold-button")
    assert rest.all_inner_texts() == ["⋯ 1 unchanged line", "⋯ 78 unchanged lines"]
    rest.nth(1).scroll_into_view_if_needed()
    bench.screenshot(page, "changes-fold-opened")
    rest.nth(1).click()
    long.locator(".line.ctx .ln-new", has_text="2086").wait_for()
    rest.first.click()
    # The last fold goes when its line arrives ("line 1" as text would match line 10 at once).
    long.locator(".line.fold").wait_for(state="detached")
    numbers = long.locator(".line .ln-new").evaluate_all("els => els.map(e => e.textContent).filter(Boolean)")
    assert numbers == [str(n) for n in range(1, 2094)]  # every line up to the last hunk's, in order
