"""Codex and Claude in the browser (issue 44's done-when): real agents, the scripted model, offline.

A Codex turn whose `exec_command` prints in colour — its `_meta.terminal_output_delta` drawn as
the card's terminal (runs/runner/translate.py) — and then asks permission for an escalated
command; a Claude turn whose `Write` waits for an edit approval, with the config pickers its
`configOptions` fill. Screenshots light, dark and phone (var/screenshots/npm-*.png).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
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
)
from tests.support.npm_agents import agents_bin, entry_for, shell_call
from tests.support.scripted_llm import ScriptedLLM, text, tool_call
from tests.test_sandbox import needs_bwrap

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.browser,
    pytest.mark.hermes,  # real agents: bin/test's SQLite pass only
    needs_bwrap,
    pytest.mark.timeout(400),
]

TURN_MS = 150_000  # a cold first turn on a busy 2-core box
PHONE = {"width": 420, "height": 860}
WIDE = {"width": 1200, "height": 800}


@pytest.fixture
def agents(tmp_path: Path, scripted_llm: ScriptedLLM) -> dict[str, Any]:
    bin_dir = agents_bin()
    return {
        name: entry_for(name, tmp_path / "operator", scripted_llm, bin_dir) for name in ("codex", "claude")
    }


@pytest.fixture
def npm_workbench(
    browser: Any, screenshots: Path, user: Any, tmp_path: Path, settings: Any, agents: dict[str, Any]
) -> Iterator[Workbench]:
    from runs.agents import load_agents

    # The web side (this process and daphne) validates agent names against its own registry.
    configured = load_agents(settings.DATA_DIR, {"HERMESWEB_AGENTS": json.dumps(agents)})
    settings.HERMESWEB_AGENTS = {**settings.HERMESWEB_AGENTS, **{n: configured[n] for n in agents}}
    (tmp_path / "data").mkdir()
    (tmp_path / "logs").mkdir()
    bench = Workbench(
        browser=browser,
        user=user,
        data_dir=tmp_path / "data",
        log_dir=tmp_path / "logs",
        screenshot_dir=screenshots,
        settings_env={"HERMESWEB_AGENTS": json.dumps(agents)},
    )
    bench.start()
    try:
        yield bench
    finally:
        bench.stop()
        print(bench.logs())
    broken = [line for line in bench.console if line.startswith("[pageerror]") or "Content Security" in line]
    assert not broken, "\n".join(broken)


def session_on(user: Any, agent: str) -> Any:
    project = factories.ProjectFactory(owner=user, name=f"{agent.title()} project", agent=agent)
    return factories.SessionFactory(project=project, title="")


def three_views(bench: Workbench, session: Any, name: str, ready: str) -> None:
    """The session again in dark and on a phone, each once `ready` shows."""
    dark = bench.new_page(viewport=WIDE, color_scheme="dark")
    open_session(dark, session.pk)
    dark.locator(ready).first.wait_for(timeout=TURN_MS)
    bench.screenshot(dark, f"{name}-dark")
    phone = bench.new_page(viewport=PHONE)
    open_session(phone, session.pk)
    phone.locator(ready).first.wait_for(timeout=TURN_MS)
    phone.locator(".approval-card[data-state='pending']").scroll_into_view_if_needed()
    card = phone.locator(".approval-card[data-state='pending']")
    assert card.evaluate("(el) => el.scrollWidth <= el.clientWidth + 1")  # no sideways scroll
    bench.screenshot(phone, f"{name}-phone")


def test_a_codex_turn_shows_its_live_terminal_then_asks_permission(
    npm_workbench: Workbench, user: Any, scripted_llm: ScriptedLLM
) -> None:
    session = session_on(user, "codex")
    doomed = Path(session.project.path) / "doomed"
    doomed.mkdir()
    printed = "printf '\\033[1;32mPASS\\033[0m tests/test_a.py\\n\\033[31mFAIL\\033[0m tests/test_b.py\\n'"
    name, arguments = shell_call("codex", printed)
    escalated, escalated_arguments = shell_call("codex", "rm -rf doomed", escalate=True)
    scripted_llm.enqueue(
        tool_call(name, arguments, call_id="call_print"),
        tool_call(escalated, escalated_arguments, call_id="call_rm"),
        text("Cleaned up."),
    )
    page = npm_workbench.new_page(viewport=WIDE)
    open_session(page, session.pk)
    send(page, "Run the tests, then clean up")
    screen = turn(page).locator(".tool-card[data-tool-kind='execute'] .terminal-screen").first
    screen.locator("span.ansi-fg-2.ansi-bold", has_text="PASS").wait_for(timeout=TURN_MS)
    assert screen.locator("span.ansi-fg-1", has_text="FAIL").count() == 1
    assert "\x1b" not in screen.inner_text() and "[0m" not in screen.inner_text()
    card = page.locator(".approval-card[data-state='pending']")
    card.wait_for(timeout=TURN_MS)
    names = card.locator(".approval-options button").all_inner_texts()
    assert "Yes, proceed" in names, names
    assert doomed.exists()  # nothing ran before the answer
    # Live: the turn is still going, the terminal already drawn, the permission waiting.
    assert turn(page).get_attribute("data-status") != "completed"
    npm_workbench.screenshot(page, "npm-codex-terminal-permission-light")
    npm_workbench.docs_screenshot(page, "codex-terminal-permission")
    three_views(
        npm_workbench, session, "npm-codex-terminal-permission", ".approval-card[data-state='pending']"
    )

    card.locator(".approval-options button", has_text="Yes, proceed").click()
    settled = wait_settled(page, 1)
    assert "Cleaned up." in settled.inner_text()
    assert not doomed.exists()


def test_a_claude_turn_waits_for_an_edit_approval_beside_its_config_pickers(
    npm_workbench: Workbench, user: Any, scripted_llm: ScriptedLLM
) -> None:
    session = session_on(user, "claude")
    target = Path(session.project.path) / "hello.py"
    scripted_llm.enqueue(
        tool_call("Write", {"file_path": str(target), "content": "print('hello')\n"}, call_id="call_write"),
        text("Wrote hello.py."),
    )
    page = npm_workbench.new_page(viewport=WIDE)
    open_session(page, session.pk)
    send(page, "Write hello.py")
    card = page.locator(".approval-card[data-state='pending']")
    card.wait_for(timeout=TURN_MS)
    assert not target.exists()  # nothing written before the answer
    names = card.locator(".approval-options button").all_inner_texts()
    assert names and names[0].startswith("Yes"), names
    # Claude's configOptions (mode, model, effort …) as pickers beside the composer.
    pickers = page.locator("[data-role=config-pickers]:not([hidden])")
    pickers.wait_for(timeout=TURN_MS)
    assert pickers.locator("select, input").count() >= 1
    npm_workbench.screenshot(page, "npm-claude-edit-approval-light")
    npm_workbench.docs_screenshot(page, "claude-edit-approval")
    three_views(npm_workbench, session, "npm-claude-edit-approval", ".approval-card[data-state='pending']")

    card.locator(".approval-options button").first.click()
    settled = wait_settled(page, 1)
    assert "Wrote hello.py." in settled.inner_text()
    assert target.read_text() == "print('hello')\n"
