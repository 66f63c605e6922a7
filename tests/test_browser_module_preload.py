"""The workbench page announces every ES module it loads with `<link rel="modulepreload">`.

The list is computed from the entry modules' imports (hermesweb.preload); the browser's own
loading is the rule it must match: a module missing from it brings back the import waterfall.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests import factories
from tests.support.browser import Workbench, browser, open_session, screenshots, workbench  # noqa: F401 - fixtures

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]


def test_every_module_the_session_page_loads_was_announced_for_preloading(
    workbench: Workbench, user: Any
) -> None:
    session = factories.SessionFactory(project=factories.ProjectFactory(owner=user), title="")
    page = workbench.new_page()
    scripts: list[str] = []
    page.on("request", lambda r: scripts.append(r.url) if r.url.partition("?")[0].endswith(".js") else None)
    open_session(page, session.pk)

    announced = page.eval_on_selector_all("link[rel=modulepreload]", "links => links.map(link => link.href)")
    loaded = {url for url in scripts if "/theme-init.js" not in url}  # a classic script
    assert loaded, "the page loaded no module"
    assert loaded <= set(announced), f"loaded but not preloaded: {sorted(loaded - set(announced))}"


# What each static file cost the page: 0 bytes over the wire is the browser's cache, where a
# revalidation (304) still carries its headers.
STATIC_TRANSFERS = """() => performance.getEntriesByType('resource')
    .filter(entry => entry.name.includes('/static/'))
    .map(entry => [entry.name, entry.transferSize])"""


def test_a_page_opened_again_takes_its_modules_from_the_browsers_cache(
    workbench: Workbench, user: Any
) -> None:
    # Versioned URLs are kept for good (hermesweb/static_assets.py): the second load asks the
    # server for no module, stylesheet or script, not even to revalidate it, and still works.
    session = factories.SessionFactory(project=factories.ProjectFactory(owner=user), title="")
    page = workbench.new_page()
    open_session(page, session.pk)
    first = dict(page.evaluate(STATIC_TRANSFERS))
    assert any("/static/js/main.js?v=" in url for url in first)
    assert all(size > 0 for size in first.values()), first

    open_session(page, session.pk)
    again = dict(page.evaluate(STATIC_TRANSFERS))
    assert set(again) >= {url for url in first if url.endswith((".js", ".css")) or "?v=" in url}
    asked = {url: size for url, size in again.items() if size != 0}
    assert not asked, f"asked of the server again: {asked}"
    refused = [line for line in workbench.console if "Content Security Policy" in line]
    assert not refused, refused
