"""The admin under the site's Content-Security-Policy, in a real browser: its pages carry the policy,
their scripts still run, and the policy refuses nothing they need (hermesweb/middleware.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests import factories
from tests.support.browser import Workbench, browser, screenshots, workbench  # noqa: F401 - fixtures

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]


def test_the_admin_runs_its_scripts_under_the_sites_policy(workbench: Workbench, user: Any) -> None:
    user.is_staff = user.is_superuser = True
    user.save()
    factories.RunFactory(session__project__owner=user)
    page = workbench.new_page()

    answer = page.goto("/admin/runs/run/")
    assert answer is not None
    assert "script-src 'self'" in answer.headers["content-security-policy"]
    # actions.js: the header checkbox selects every row.
    page.locator("#action-toggle").check()
    assert page.locator("input.action-select:checked").count() == 1
    assert page.locator(".action-counter").inner_text().startswith("1 of 1")

    answer = page.goto(f"/admin/auth/user/{user.pk}/change/")
    assert answer is not None and "content-security-policy" in answer.headers
    # DateTimeShortcuts.js adds "Today" and "Now" beside the date fields.
    assert page.locator(".datetimeshortcuts a").first.is_visible()
    # The fixture fails the test on any script error or anything the policy refused.
