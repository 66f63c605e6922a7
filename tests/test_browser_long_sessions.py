"""A long session in a real browser: the newest page of turns first, earlier ones on scroll-up or
with "Load earlier turns", the reader's place kept (docs/ui.md, "Long sessions").
"""

from __future__ import annotations

from typing import Any

import pytest

from runs import journal
from runs.journal import NewEvent, done_event
from runs.models import Run, RunStatus
from runs.transcript_pages import PAGE_TURNS
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


FILLER = "\n\n".join(f"Paragraph {n} of the answer, a few words to fill the screen." for n in range(3))
OLDEST_PAGE = 4


def settled_turn(session: Any, n: int) -> Run:
    run = factories.RunFactory(
        session=session,
        prompt_text=f"Question {n}",
        status=RunStatus.RUNNING,
        **fixture_lease(),
    )
    journal.append_batch(
        run.pk,
        [
            NewEvent("run.started", {"status": "running"}),
            NewEvent("token.delta", {"message_id": "m1", "delta": f"**Answer {n}.**\n\n{FILLER}"}),
        ],
        publish=False,
    )
    finish_run(run.pk, [done_event(RunStatus.COMPLETED, stop_reason="end_turn")])
    return run


@pytest.fixture
def long_session(user: Any) -> tuple[Any, list[Run]]:
    """Two full pages of turns and a few more: three pages, the oldest short."""
    session = factories.SessionFactory(project=factories.ProjectFactory(owner=user), title="Long session")
    return session, [settled_turn(session, n) for n in range(2 * PAGE_TURNS + OLDEST_PAGE)]


def turn_ids(page: Any) -> list[int]:
    return page.evaluate(
        "() => [...document.querySelectorAll('article.turn')].map((t) => Number(t.id.slice(4)))"
    )


def top_of(page: Any, run_id: int) -> float:
    """Where the turn is in the transcript's view, in pixels from its top."""
    return page.evaluate(
        """(id) => document.getElementById(`run-${id}`).getBoundingClientRect().top
            - document.querySelector('[data-role=scroller]').getBoundingClientRect().top""",
        run_id,
    )


def scroll_to_top(page: Any, run_id: int) -> float:
    """Scroll the transcript to its top, as the reader would, and return where the turn was then
    (the turn at the top of what is loaded).

    Set again on every poll until the earlier page is asked for: under load the browser may
    coalesce the scroll with the page's own layout, so one set is not sure to be seen.
    """
    page.wait_for_function(
        """(id) => {
            const first = document.querySelector('article.turn');
            if (first.id !== `run-${id}`) return true; // the earlier page came between two polls
            if (document.querySelector('.load-earlier button[aria-busy=true]')) return true;
            const scroller = document.querySelector('[data-role=scroller]');
            scroller.scrollTop = 0;
            window.topBeforeLoad = document.getElementById(`run-${id}`).getBoundingClientRect().top
                - scroller.getBoundingClientRect().top;
            return false;
        }""",
        arg=run_id,
    )
    return page.evaluate("() => window.topBeforeLoad")


def wait_turns(page: Any, count: int) -> None:
    page.wait_for_function(
        "(n) => document.querySelectorAll('article.turn').length === n "
        "&& !document.querySelector('.load-earlier button[aria-busy=true]')",
        arg=count,
    )


def test_the_newest_page_loads_first_and_earlier_turns_come_on_scroll_up_and_on_the_button(
    workbench: Workbench, long_session: tuple[Any, list[Run]]
) -> None:
    session, runs = long_session
    page = workbench.new_page()
    open_session(page, session.pk)

    # The newest page, rendered, read from the bottom; the button says there is more.
    assert turn_ids(page) == [r.pk for r in runs[-PAGE_TURNS:]]
    page.wait_for_selector(f"#run-{runs[-1].pk}[data-rendered='true']")
    button = page.get_by_role("button", name="Load earlier turns")
    assert button.count() == 1

    # Scrolling up to the top reads the page before, and what the reader saw stays where it was.
    first = runs[-PAGE_TURNS].pk
    before = scroll_to_top(page, first)
    wait_turns(page, 2 * PAGE_TURNS)
    assert turn_ids(page) == [r.pk for r in runs[-2 * PAGE_TURNS :]]
    assert abs(top_of(page, first) - before) < 2
    page.wait_for_selector(f"#run-{runs[OLDEST_PAGE].pk}[data-rendered='true']")

    # The button, from the keyboard: the last page; the button goes and focus stays in the transcript.
    button.focus()
    workbench.screenshot(page, "long-session-load-earlier")
    second = runs[OLDEST_PAGE].pk
    before = top_of(page, second)
    page.keyboard.press("Enter")
    wait_turns(page, len(runs))
    assert turn_ids(page) == [r.pk for r in runs]
    assert abs(top_of(page, second) - before) < 2
    assert page.get_by_role("button", name="Load earlier turns").count() == 0
    assert page.evaluate("() => document.activeElement?.id") == f"run-{runs[OLDEST_PAGE - 1].pk}"
    assert page.get_by_role("status").filter(has_text="4 earlier turns loaded.").count() == 1
    page.wait_for_selector(f"#run-{runs[0].pk}[data-rendered='true']")


def test_a_link_to_an_old_turn_reads_back_to_it(
    workbench: Workbench, long_session: tuple[Any, list[Run]]
) -> None:
    session, runs = long_session
    page = workbench.new_page()

    page.goto(f"/sessions/{session.pk}/#run-{runs[1].pk}")

    page.wait_for_function("(id) => document.activeElement?.id === `run-${id}`", arg=runs[1].pk)
    assert len(turn_ids(page)) == len(runs)
    assert 0 <= top_of(page, runs[1].pk) < 40


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("long-session-dark", {"color_scheme": "dark"}),
        ("long-session-phone", {"viewport": {"width": 420, "height": 860}}),
    ],
)
def test_the_load_earlier_button_in_dark_and_on_a_phone_is_accessible(
    workbench: Workbench, long_session: tuple[Any, list[Run]], name: str, options: dict[str, Any]
) -> None:
    session, _ = long_session
    page = workbench.new_page(bypass_csp=True, **options)
    open_session(page, session.pk)
    button = page.get_by_role("button", name="Load earlier turns")

    button.scroll_into_view_if_needed()
    page.wait_for_function("() => document.querySelectorAll('article.turn').length > 0")
    workbench.screenshot(page, name)

    assert axe_violations(page) == []
