"""Where the reader is in a real browser (static/js/position.js, docs/ui.md "Scroll position"):
text laid out after it arrived keeps a reader at the bottom there, and leaves one who scrolled up
where they are.
"""

from __future__ import annotations

from typing import Any

import pytest

from runs.models import Run
from tests import factories
from tests.support.browser import (  # noqa: F401 - fixtures
    Workbench,
    browser,
    open_session,
    screenshots,
    workbench,
)
from tests.test_browser_long_sessions import settled_turn

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

AT_BOTTOM = """() => {
    const s = document.querySelector('[data-role=scroller]');
    return s.scrollHeight - s.scrollTop - s.clientHeight < 24;
}"""


OVERFLOWS = """() => {
    const s = document.querySelector('[data-role=scroller]');
    return s.scrollHeight - s.clientHeight > 200;
}"""


@pytest.fixture
def session_with_turns(user: Any) -> tuple[Any, list[Run]]:
    """A few settled turns, more than a screen and fewer than a page."""
    session = factories.SessionFactory(project=factories.ProjectFactory(owner=user), title="Reading")
    return session, [settled_turn(session, n) for n in range(6)]


def scroll_to(page: Any, where: str) -> None:
    """Scroll as the reader does, and wait until the page has heard of it (a scroll event).

    A view already there sends no scroll event: said at once, not waited on for ever."""
    moved = page.evaluate(
        """(where) => new Promise((done) => {
            const s = document.querySelector('[data-role=scroller]');
            const target = where === 'top' ? 0 : s.scrollHeight - s.clientHeight;
            if (Math.abs(s.scrollTop - target) < 1) return done(false);
            s.addEventListener('scroll', () => requestAnimationFrame(() => done(true)), { once: true });
            s.scrollTop = target;
        })""",
        where,
    )
    assert moved, f"the view was at the {where} already"


def grow_below(page: Any) -> None:
    """Text laid out after it arrived (markdown rendered, text sized once shown): taller, no draw."""
    page.evaluate(
        """() => {
            const turns = document.querySelectorAll('article.turn');
            const tall = document.createElement('div');
            tall.style.height = '900px';
            turns[turns.length - 1].append(tall);
        }"""
    )


@pytest.fixture
def page_at_bottom(workbench: Workbench, session_with_turns: tuple[Any, list[Run]]) -> Any:
    """The session open, rendered and read from the bottom, as it opens."""
    session, runs = session_with_turns
    page = workbench.new_page()
    open_session(page, session.pk)
    page.wait_for_selector(f"#run-{runs[-1].pk}[data-rendered='true']")
    # Taller than the view, then at its bottom: turns still drawn plain may be short at first.
    page.wait_for_function(f"() => ({OVERFLOWS})() && ({AT_BOTTOM})()")
    return page


def test_a_reader_back_at_the_bottom_follows_text_laid_out_below(page_at_bottom: Any) -> None:
    page = page_at_bottom

    scroll_to(page, "top")
    scroll_to(page, "bottom")
    grow_below(page)

    page.wait_for_function(AT_BOTTOM)


def test_a_reader_who_scrolled_up_stays_where_they_are_when_text_grows_below(page_at_bottom: Any) -> None:
    page = page_at_bottom

    scroll_to(page, "top")
    grow_below(page)
    page.evaluate("() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))")

    assert page.evaluate("() => document.querySelector('[data-role=scroller]').scrollTop") == 0
