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
    page.on("request", lambda r: scripts.append(r.url) if r.url.endswith(".js") else None)
    open_session(page, session.pk)

    announced = page.eval_on_selector_all("link[rel=modulepreload]", "links => links.map(link => link.href)")
    loaded = {url for url in scripts if not url.endswith("/theme-init.js")}  # a classic script
    assert loaded, "the page loaded no module"
    assert loaded <= set(announced), f"loaded but not preloaded: {sorted(loaded - set(announced))}"
