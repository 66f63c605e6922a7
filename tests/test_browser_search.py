"""Search in a real browser: the sidebar's box finds turns by their content, and a hit opens its
session scrolled to that turn (docs/search.md). Same harness as the other browser tests.
"""

from __future__ import annotations

from typing import Any

import pytest

from runs import journal
from runs.journal import NewEvent, done_event
from runs.models import Run, RunStatus
from runs.turns import finish_run
from tests import factories
from tests.support.browser import (  # noqa: F401 - fixtures
    Workbench,
    axe_violations,
    browser,
    fixture_lease,
    open_session,
    screenshots,
    workbench,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]


FILLER = "\n\n".join(
    f"Paragraph {n}: nothing to find here, only words that fill the page." for n in range(14)
)


def settled_turn(session: Any, prompt: str, answer: str, tools: tuple[str, ...] = ()) -> Run:
    """A turn that ran and settled: its terminal event through finish_run, which indexes it."""
    run = factories.RunFactory(
        session=session,
        prompt_text=prompt,
        status=RunStatus.RUNNING,
        **fixture_lease(),
    )
    events = [NewEvent("run.started", {"status": "running"})]
    for index, title in enumerate(tools):
        events.append(
            NewEvent("tool.started", {"tool_call_id": f"t{index}", "title": title, "status": "pending"})
        )
        events.append(NewEvent("tool.done", {"tool_call_id": f"t{index}", "status": "completed"}))
    events.append(NewEvent("token.delta", {"message_id": "m1", "delta": answer}))
    journal.append_batch(run.pk, events, publish=False)
    finish_run(run.pk, [done_event(RunStatus.COMPLETED, stop_reason="end_turn")])
    return run


@pytest.fixture
def sessions(user: Any, other_user: Any) -> dict[str, Any]:
    project = factories.ProjectFactory(owner=user, name="Demo project")
    parser = factories.SessionFactory(project=project, title="Parser work")
    settled_turn(parser, "Step 0", FILLER)
    # The hit: early in a long session, so opening it must scroll up to it.
    hit = settled_turn(
        parser,
        "Where is the wind config loaded?",
        "The zephyr <b>not bold</b> settings live in `config/loader.py`.",
    )
    for n in range(6):
        settled_turn(parser, f"Step {n + 1}", FILLER)
    quasar = settled_turn(parser, "And the other one?", "The quasar module reads it.\n\n" + FILLER)
    for n in range(3):
        settled_turn(parser, f"Later step {n}", FILLER)
    release = factories.SessionFactory(project=project, title="Release notes")
    settled_turn(release, "Draft the notes", "Done.", ("Read zephyr.toml",))
    theirs = factories.SessionFactory(
        project=factories.ProjectFactory(owner=other_user), title="Someone else's"
    )
    settled_turn(theirs, "zephyr everywhere", "zephyr")
    return {"parser": parser, "release": release, "hit": hit, "quasar": quasar}


def wait_hits(page: Any, count: int) -> Any:
    results = page.get_by_role("region", name="Turns matching the search")
    page.wait_for_function(
        "(n) => document.querySelectorAll('#search-results a.search-hit').length === n "
        "&& !document.querySelector('#search-results [aria-busy=true]')",
        arg=count,
    )
    return results


def revealed(page: Any, run_id: int) -> None:
    """The turn is focused, marked, at the top of the transcript's view, and the view is not at the bottom."""
    page.wait_for_function("(id) => document.activeElement?.id === `run-${id}`", arg=run_id)
    place = page.evaluate(
        """(id) => {
            const scroller = document.querySelector('[data-role=scroller]');
            const turn = document.getElementById(`run-${id}`);
            const top = turn.getBoundingClientRect().top - scroller.getBoundingClientRect().top;
            const atBottom = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 24;
            return { top, atBottom, marked: turn.classList.contains('revealed') };
        }""",
        run_id,
    )
    assert 0 <= place["top"] < 40, place
    assert not place["atBottom"] and place["marked"], place


def test_search_finds_turns_and_opens_the_session_at_the_hit(
    workbench: Workbench, sessions: dict[str, Any]
) -> None:
    page = workbench.new_page()
    open_session(page, sessions["release"].pk)
    box = page.get_by_role("searchbox", name="Search sessions")
    box.fill("zephyr")
    results = wait_hits(page, 2)
    assert results.get_by_role("status").inner_text() == "2 turns match"
    hits = results.get_by_role("link")
    titles = [hits.nth(i).locator(".hit-title").inner_text() for i in range(2)]
    assert sorted(titles) == ["Parser work", "Release notes"]  # never the other user's
    parser_hit = results.locator(f"a.search-hit[data-run-id='{sessions['hit'].pk}']")
    snippet = parser_hit.locator(".hit-snippet")
    assert snippet.locator("mark").all_inner_texts() == ["zephyr"]
    # The agent's markup is text in the snippet, never an element.
    assert "<b>not bold</b>" in snippet.inner_text()
    assert page.locator("#search-results .hit-snippet *:not(mark)").count() == 0
    assert parser_hit.get_attribute("href") == f"/sessions/{sessions['parser'].pk}/#run-{sessions['hit'].pk}"
    workbench.docs_screenshot(page, "search")

    # The keyboard: ↓ from the box into the hits, ↑/↓ between them, Esc back, Enter opens.
    box.press("ArrowDown")
    page.wait_for_function("() => document.activeElement?.classList.contains('search-hit')")
    if page.evaluate("() => document.activeElement.dataset.runId") != str(sessions["hit"].pk):
        page.keyboard.press("ArrowDown")
    assert page.evaluate("() => document.activeElement.dataset.runId") == str(sessions["hit"].pk)
    page.keyboard.press("Escape")
    page.wait_for_function("() => document.activeElement?.dataset.role === 'search'")
    box.press("ArrowDown")
    if page.evaluate("() => document.activeElement.dataset.runId") != str(sessions["hit"].pk):
        page.keyboard.press("ArrowDown")
    with page.expect_navigation():
        page.keyboard.press("Enter")
    assert page.url.endswith(f"/sessions/{sessions['parser'].pk}/#run-{sessions['hit'].pk}")
    page.wait_for_selector("#workbench[data-ready='true']")
    revealed(page, sessions["hit"].pk)
    workbench.screenshot(page, "search-hit-opened")

    # A hit in the session already open is shown in place, without loading the page again.
    page.evaluate("() => { window.__samePage = true; }")
    box = page.get_by_role("searchbox", name="Search sessions")
    box.fill("quasar")
    wait_hits(page, 1).get_by_role("link").click()
    revealed(page, sessions["quasar"].pk)
    assert page.evaluate("() => window.__samePage === true")
    assert page.url.endswith(f"#run-{sessions['quasar'].pk}")

    # Words that match nothing, and a query that is only syntax, say so.
    box.fill('"NEAR(*)" -')
    page.get_by_role("region", name="Turns matching the search").get_by_text("No messages match.").wait_for()


def test_search_results_are_accessible(workbench: Workbench, sessions: dict[str, Any]) -> None:
    page = workbench.new_page(bypass_csp=True)
    open_session(page, sessions["release"].pk)
    page.get_by_role("searchbox", name="Search sessions").fill("zephyr")
    wait_hits(page, 2)
    assert axe_violations(page) == []
