"""Real-browser test support: Debian's chromium driven by Playwright, real daphne and runner.

Import the fixtures into a test module with
`from tests.support.browser import browser, screenshots, workbench  # noqa: F401`.

Tests using `workbench` need `@pytest.mark.django_db(transaction=True)`: the
subprocesses read the rows the test writes. Waits are on DOM state
(selectors, `wait_for_function`), never on sleeps.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from tests.support import procs

CHROMIUM = os.environ.get("HERMESWEB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Generous: CI machines are slow, and a wait ends as soon as its condition holds.
TIMEOUT_MS = 30_000
SCREENSHOT_DIR = Path(os.environ.get("HERMESWEB_SCREENSHOTS") or procs.REPO / "var" / "screenshots")
# The few screenshots the README and docs/ui.md show, kept in the repository.
DOCS_SCREENSHOT_DIR = procs.REPO / "docs" / "screenshots"
# axe-core for the accessibility checks: injected by the tests only, never served.
AXE_JS = Path(__file__).resolve().parent / "vendor" / "axe-core" / "axe.min.js"


# Test modules import these fixtures, so pytest sees one definition per module;
# the screenshot notice must still be printed once per test session.
_SHARED: dict[str, Any] = {}


@pytest.fixture(scope="session")
def screenshots(request: pytest.FixtureRequest) -> Path:
    """Where the screenshots of the main states go; printed once per test session."""
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    if not _SHARED.get("announced"):
        _SHARED["announced"] = True
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        line = f"browser screenshots: {SCREENSHOT_DIR}"
        if reporter is not None and capture is not None:
            # Output capture is on during setup; step around it so the line reaches the terminal.
            with capture.global_and_fixture_disabled():
                reporter.write_line(line)
        else:
            print(line)
    return SCREENSHOT_DIR


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One chromium per test module.

    Not per session: while Playwright's sync API runs, its event loop is this
    thread's running loop, and later modules' `asyncio.run()` would refuse to start.
    """
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"needs chromium at {CHROMIUM} (Debian: apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("needs the playwright Python package")
    # That same loop makes Django refuse ORM calls from the test, which are
    # ordinary blocking calls between browser steps all the same.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            instance = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                yield instance
            finally:
                instance.close()
    finally:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


@dataclass
class Workbench:
    """daphne + runner on the test database, and signed-in browser pages."""

    browser: Any
    user: Any
    data_dir: Path
    log_dir: Path
    screenshot_dir: Path
    port: int = 0
    daphne: procs.Proc | None = None
    runner: procs.Proc | None = None
    contexts: list[Any] = field(default_factory=list)
    console: list[str] = field(default_factory=list)
    settings_env: dict[str, str] = field(default_factory=dict)  # restart_daphne's settings

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        # The subprocesses must not inherit the test process's async-unsafe escape hatch.
        base = {"HERMESWEB_DATA_DIR": str(self.data_dir), "REDIS_URL": "", "DJANGO_ALLOW_ASYNC_UNSAFE": ""}
        return {**base, **self.settings_env}

    def start(self) -> None:
        self.runner = procs.start_runner(self.log_dir, runner_id="browser", **self.env())
        self.start_daphne()

    def start_daphne(self) -> None:
        self.daphne, self.port = procs.start_daphne(self.log_dir, port=self.port or None, **self.env())

    def restart_daphne(self, **settings: str) -> None:
        """daphne again, with these settings in its environment (e.g. a smaller page budget)."""
        self.settings_env.update(settings)
        assert self.daphne is not None
        self.daphne.stop()
        self.start_daphne()

    def kill_daphne(self) -> None:
        assert self.daphne is not None
        self.daphne.kill9()

    def stop(self) -> None:
        for context in self.contexts:
            context.close()
        for proc in (self.daphne, self.runner):
            if proc is not None:
                proc.stop()

    def logs(self, tail: int = 4000) -> str:
        parts = []
        for proc in (self.daphne, self.runner):
            if proc is not None:
                parts.append(f"----- {proc.name} ({proc.log_path})\n{proc.log()[-tail:]}")
        if self.console:
            parts.append("----- browser console\n" + "\n".join(self.console[-100:]))
        return "\n".join(parts)

    def new_page(
        self,
        *,
        viewport: dict[str, int] | None = None,
        color_scheme: str = "light",
        signed_in: bool = True,
        bypass_csp: bool = False,
        permissions: list[str] | None = None,
    ) -> Any:
        """A page in a context of its own.

        `bypass_csp`: only for injecting a test tool (axe-core) into the page; the CSP
        checks of the other tests see the real policy.
        """
        context = self.browser.new_context(
            base_url=self.base_url,
            viewport=viewport or {"width": 1280, "height": 860},
            color_scheme=color_scheme,
            bypass_csp=bypass_csp,
            permissions=permissions or [],
        )
        if signed_in:
            client = Client()
            client.force_login(self.user)
            context.add_cookies(
                [{"name": "sessionid", "value": client.cookies["sessionid"].value, "url": self.base_url}]
            )
        context.set_default_timeout(TIMEOUT_MS)
        self.contexts.append(context)
        page = context.new_page()
        self.watch(page)
        return page

    def watch(self, page: Any) -> None:
        page.on("console", lambda msg: self.console.append(f"[{msg.type}] {msg.text}"))
        page.on("pageerror", lambda exc: self.console.append(f"[pageerror] {exc}"))

    def screenshot(self, page: Any, name: str) -> None:
        page.screenshot(path=str(self.screenshot_dir / f"{name}.png"), full_page=False)

    def docs_screenshot(self, page: Any, name: str) -> None:
        """The usual screenshot; with HERMESWEB_DOCS_SCREENSHOTS=1 also the docs' copy (shown by the README).

        Opt-in: an ordinary test run must not leave the checkout's tracked images changed.
        """
        self.screenshot(page, name)
        if os.environ.get("HERMESWEB_DOCS_SCREENSHOTS") != "1":
            return
        DOCS_SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(DOCS_SCREENSHOT_DIR / f"{name}.png"), full_page=False)


@pytest.fixture
def workbench(browser: Any, screenshots: Path, user: Any, tmp_path: Path) -> Iterator[Workbench]:
    data_dir = tmp_path / "data"
    log_dir = tmp_path / "logs"
    data_dir.mkdir()
    log_dir.mkdir()
    bench = Workbench(
        browser=browser, user=user, data_dir=data_dir, log_dir=log_dir, screenshot_dir=screenshots
    )
    bench.start()
    try:
        yield bench
    finally:
        bench.stop()
        # Shown by pytest only when the test failed.
        print(bench.logs())
    # Every test also checks that no script threw and the CSP refused nothing.
    broken = [
        line for line in bench.console if line.startswith("[pageerror]") or "Content Security Policy" in line
    ]
    assert not broken, "\n".join(broken)


# ---------------------------------------------------------------- page helpers


def open_session(page: Any, session_id: int) -> None:
    page.goto(f"/sessions/{session_id}/")
    page.wait_for_selector("#workbench[data-ready='true']")
    page.wait_for_selector(".connection[data-state='live']")


def send(page: Any, text: str) -> None:
    box = page.locator(".composer textarea")
    box.fill(text)
    box.press("Enter")


def turn(page: Any, index: int = -1) -> Any:
    turns = page.locator("article.turn")
    return turns.nth(index) if index >= 0 else turns.last


def wait_settled(page: Any, count: int, status: str = "completed") -> Any:
    """Wait for `count` turns, the last one settled with `status` and its markdown rendered."""
    page.wait_for_function(
        """([count, status]) => {
            const turns = document.querySelectorAll('article.turn');
            const last = turns[turns.length - 1];
            return turns.length === count && last.dataset.status === status
                && last.dataset.rendered === 'true';
        }""",
        arg=[count, status],
    )
    return turn(page, count - 1)


def transcript_snapshot(page: Any) -> str:
    """The transcript as a user sees it, whitespace-normalized, for comparing two pages."""
    text = page.locator("[data-role=transcript]").inner_text()
    return re.sub(r"[ \t]+", " ", text).strip()


def axe_violations(page: Any, *, impacts: tuple[str, ...] = ("serious", "critical")) -> list[dict[str, Any]]:
    """Run axe-core on the page (a context made with `bypass_csp=True`); the violations of `impacts`.

    Each is {id, impact, help, nodes: [html of up to five offending nodes]}.
    """
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.add_script_tag(path=str(AXE_JS))
    found = page.evaluate(
        """async () => {
            const result = await axe.run(document, { resultTypes: ['violations'] });
            return result.violations.map((v) => ({
                id: v.id, impact: v.impact, help: v.help,
                nodes: v.nodes.slice(0, 5).map((n) => n.html + ' :: ' + (n.failureSummary || '')),
            }));
        }"""
    )
    return [violation for violation in found if violation["impact"] in impacts]


def fixture_lease() -> dict[str, Any]:
    """Lease fields for a running run the test itself plays (appending its events).

    The workbench's runner reaps a running run whose lease lapsed, whose runner's pid is dead
    here, or whose runner it does not know: this names a runner row for the test's own process,
    alive on this host, with a lease that outlasts the test.
    """
    from runs.models import Runner

    Runner.objects.update_or_create(id="fixture", defaults={"host": socket.gethostname(), "pid": os.getpid()})
    return {"lease_owner": "fixture", "lease_expires_at": timezone.now() + timedelta(days=1)}
