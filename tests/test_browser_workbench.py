"""The workbench in a real browser (Debian's chromium, headless), against real daphne and runner.

Each test drives the bundled demo agent through its trigger words
(docs/demo-agent.md) and waits on DOM state, never on time.
"""

from __future__ import annotations

import json
import re
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
    transcript_snapshot,
    turn,
    wait_settled,
    workbench,
)
from tests.support.hold import release

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]


@pytest.fixture
def session(user: Any) -> Any:
    project = factories.ProjectFactory(owner=user, name="Demo project")
    return factories.SessionFactory(project=project, title="")


def test_it_streams_an_answer_and_renders_its_markdown(workbench: Workbench, session: Any) -> None:
    page = workbench.new_page()
    open_session(page, session.pk)
    send(page, "hello there")
    first = turn(page)
    assert first.locator(".user-text").inner_text() == "hello there"
    # Live: text arrives as plain text while the run is still going.
    page.wait_for_function(
        """() => {
            const turn = document.querySelector('article.turn');
            const live = turn && turn.querySelector('.md.live');
            return turn.dataset.status === 'running' && live && live.textContent.length > 0;
        }"""
    )
    settled = wait_settled(page, 1)
    rendered = settled.locator(".md.rendered")
    assert rendered.locator("h2").first.inner_text() == "Demo answer"
    assert settled.locator(".code-block .copy-code").count() >= 1
    assert settled.locator("blockquote").first.inner_text().strip() == "hello there"
    page.wait_for_selector(".run-status[data-status='idle']")
    # The agent named the session from the first prompt.
    page.wait_for_function("() => document.querySelector('[data-role=title]').textContent === 'Hello there'")
    workbench.screenshot(page, "01-streamed-answer")


def test_approve_then_deny(workbench: Workbench, session: Any) -> None:
    cwd = Path(session.project.path)
    page = workbench.new_page()
    open_session(page, session.pk)

    send(page, "approve this write")
    card = page.locator(".approval-card[data-state='pending']")
    card.wait_for()
    page.wait_for_selector(".run-status[data-status='awaiting_approval']")
    names = card.locator(".approval-options button").all_inner_texts()
    assert names == ["Allow once", "Allow for session", "Deny", "Always deny"]
    workbench.screenshot(page, "02-approval-pending")
    card.get_by_role("button", name="Allow once").click()
    settled = wait_settled(page, 1)
    assert "Answered: Allow once" in settled.locator(".approval-card").inner_text()
    assert "Approved: wrote approved.txt" in settled.inner_text()
    assert (cwd / "approved.txt").exists()

    send(page, "edit the demo file")
    card = page.locator(".approval-card[data-state='pending']")
    card.wait_for()
    # The edit's diff (on its tool card) is shown before the user decides.
    diff = turn(page).locator(".tool-card[data-tool-kind='edit'] .diff")
    assert diff.locator(".diff-path").inner_text().endswith("demo-edit.txt")
    assert diff.locator(".line.add").count() >= 1
    card.get_by_role("button", name="Deny", exact=True).click()
    settled = wait_settled(page, 2)
    assert settled.locator(".approval-card[data-state='denied']").count() == 1
    assert "nothing written" in settled.inner_text()
    assert not (cwd / "demo-edit.txt").exists()
    workbench.screenshot(page, "03-approval-denied")


def test_answer_a_clarify_question(workbench: Workbench, session: Any) -> None:
    page = workbench.new_page()
    open_session(page, session.pk)
    send(page, "ask me something")
    form = page.locator(".clarify-card[data-state='open']")
    form.wait_for()
    assert form.locator(".clarify-question").inner_text() == "Which colour should I use?"
    page.wait_for_selector(".run-status[data-status='awaiting_clarify']")
    workbench.screenshot(page, "04-clarify-form")
    field = form.locator("input[name='answer']")
    field.fill("teal")
    field.press("Enter")
    settled = wait_settled(page, 1)
    assert "You answered: teal" in settled.inner_text()
    assert "Answered: answer: teal" in settled.locator(".clarify-card").inner_text()


def intent_texts(page: Any) -> list[str]:
    return page.locator(".intent-card[data-kind='queue'] .intent-text").all_inner_texts()


def wait_intents(page: Any, texts: list[str]) -> None:
    page.wait_for_function(
        """(texts) => {
            const cards = document.querySelectorAll(".intent-card[data-kind='queue'] .intent-text");
            return JSON.stringify([...cards].map((e) => e.textContent)) === JSON.stringify(texts);
        }""",
        arg=texts,
    )


def card(page: Any, text: str) -> Any:
    return page.locator(".intent-card[data-kind='queue']").filter(
        has=page.locator(".intent-text", has_text=text)
    )


def test_queue_reorder_edit_steer_and_stop_and_send(workbench: Workbench, session: Any) -> None:
    page = workbench.new_page()
    open_session(page, session.pk)
    # Held until Stop & send cancels it: the steps below never race the stream's end.
    send(page, "hold")
    # Streaming, so the agent's session is open and can take a steer.
    wait_for_text(page, "Held chunk 1.")
    # While a run is active the composer offers Queue/Steer, defaulting to the project's setting.
    page.wait_for_selector("[data-role=mode]:not([hidden]) button[data-mode='queue'][aria-pressed='true']")
    assert page.locator("[data-role=send]").inner_text() == "Queue"

    send(page, "first queued")
    wait_intents(page, ["first queued"])
    send(page, "second queued")
    wait_intents(page, ["first queued", "second queued"])

    card(page, "first queued").get_by_role("button", name="Move down").click()
    wait_intents(page, ["second queued", "first queued"])

    card(page, "first queued").get_by_role("button", name="Edit").click()
    editor = page.locator(".intent-card textarea.intent-edit")
    editor.fill("first queued, edited")
    editor.press("Enter")
    wait_intents(page, ["second queued", "first queued, edited"])
    workbench.screenshot(page, "05-queued-intents")

    # Upgrade to Steer: it leaves the queue and shows up as a quiet control event in the running turn.
    card(page, "second queued").get_by_role("button", name="Steer").click()
    wait_intents(page, ["first queued, edited"])
    running = turn(page, 0)
    running.locator(".control-event .control-text", has_text="second queued").wait_for()
    # Any text item, not only `.md.live`: under load the notice and the chunks after it can come
    # in one batch, and a text already followed by another is drawn lazily (transcript.js).
    running.locator(".md", has_text="Steer received: second queued").wait_for()
    workbench.screenshot(page, "06-steer-delivered")

    # Stop-and-send: the held run is cancelled and the queued message becomes the next turn.
    card(page, "first queued, edited").get_by_role("button", name="Stop & send").click()
    settled = wait_settled(page, 2)
    assert settled.locator(".user-text").inner_text() == "first queued, edited"
    assert settled.locator(".turn-source").inner_text() == "stop-and-send"
    cancelled = turn(page, 0)
    assert cancelled.get_attribute("data-status") == "cancelled"
    assert cancelled.locator(".turn-banner").inner_text().startswith("Cancelled")
    assert intent_texts(page) == []
    # The steer never became a user turn.
    assert page.locator(".user-text").all_inner_texts() == ["hold", "first queued, edited"]
    workbench.screenshot(page, "07-stop-and-send")


def held_chunks(page: Any) -> int:
    return len(re.findall(r"Held chunk \d+\.", turn(page).inner_text()))


def live_text(page: Any) -> str:
    return " ".join(turn(page).locator(".md").all_inner_texts())


def wait_for_text(page: Any, text: str) -> None:
    page.wait_for_function(
        """(text) => {
            const turns = document.querySelectorAll('article.turn');
            return turns.length && turns[turns.length - 1].textContent.includes(text);
        }""",
        arg=text,
    )


def test_a_refresh_mid_run_shows_what_an_uninterrupted_page_shows(workbench: Workbench, session: Any) -> None:
    watcher = workbench.new_page()
    open_session(watcher, session.pk)
    page = workbench.new_page()
    open_session(page, session.pk)
    send(page, "hold")  # held until the Stop below
    wait_for_text(page, "Held chunk 3.")
    # Steer from the composer while the run is going: a control event both pages must show once.
    page.locator("[data-role=mode] button[data-mode='steer']").click()
    send(page, "mind the tests")
    page.locator(".control-event .control-text", has_text="mind the tests").wait_for()

    page.reload()
    page.wait_for_selector("#workbench[data-ready='true']")
    page.wait_for_selector("article.turn[data-status='running']")
    wait_for_text(page, "Held chunk 12.")
    page.reload()
    page.wait_for_selector("article.turn[data-status='running']")
    wait_for_text(page, "Held chunk 20.")
    workbench.screenshot(page, "08-refreshed-mid-run")

    page.locator("[data-role=stop]").click()
    wait_settled(page, 1, "cancelled")
    wait_settled(watcher, 1, "cancelled")
    fresh = workbench.new_page()
    open_session(fresh, session.pk)
    wait_settled(fresh, 1, "cancelled")

    seen = transcript_snapshot(watcher)
    assert transcript_snapshot(page) == seen
    assert transcript_snapshot(fresh) == seen
    assert seen.count("Held chunk 3. ") == 1
    assert page.locator(".control-event").count() == 1
    assert page.locator(".user-text").all_inner_texts() == ["hold"]


def test_the_run_goes_on_while_the_web_process_restarts(workbench: Workbench, session: Any) -> None:
    page = workbench.new_page()
    open_session(page, session.pk)
    # Held across the whole restart, released once the page is live again.
    send(page, "hold")
    wait_for_text(page, "Held chunk 5.")
    shown_before = held_chunks(page)
    workbench.kill_daphne()
    page.wait_for_selector(".connection[data-state='reconnecting'], .connection[data-state='offline']")
    workbench.screenshot(page, "09-web-process-down")
    workbench.start_daphne()
    page.wait_for_selector(".connection[data-state='live']")
    # The run went on: the page, live again, gets chunks streamed since the web went down.
    wait_for_text(page, f"Held chunk {shown_before + 10}.")
    release(session.project.path)
    settled = wait_settled(page, 1)
    # Every chunk exactly once and in order: nothing lost or repeated across the restart.
    text = " ".join(settled.locator(".md").all_inner_texts())
    chunks = [int(n) for n in re.findall(r"Held chunk (\d+)\.", text)]
    assert chunks == list(range(1, len(chunks) + 1))
    assert f"Released after {len(chunks)} held chunks." in text
    fresh = workbench.new_page()
    open_session(fresh, session.pk)
    wait_settled(fresh, 1)
    assert transcript_snapshot(fresh) == transcript_snapshot(page)


def test_html_and_script_in_messages_stay_inert(workbench: Workbench, session: Any) -> None:
    payload = (
        'look <img src=x onerror="window.__xss=1"> <script>window.__xss=2</script> '
        "[click](javascript:window.__xss=3) <svg onload=window.__xss=4></svg> <b>bold?</b>"
    )
    page = workbench.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    open_session(page, session.pk)
    send(page, payload)
    settled = wait_settled(page, 1)
    assert settled.locator(".user-text").inner_text() == payload
    # The agent quoted the prompt back as markdown: it arrives as text, not markup.
    assert "<script>window.__xss=2</script>" in settled.locator(".md.rendered blockquote").inner_text()

    def assert_inert() -> None:
        assert dialogs == []
        assert page.evaluate("window.__xss") is None
        transcript = page.locator("[data-role=transcript]")
        for tag in ("img", "script", "svg", "iframe", "b"):
            assert transcript.locator(tag).count() == 0, tag
        assert page.locator("a[href^='javascript']").count() == 0

    assert_inert()
    page.reload()
    wait_settled(page, 1)
    assert_inert()
    workbench.screenshot(page, "10-inert-payload")


def test_the_command_palette_and_the_phone_layout(workbench: Workbench, session: Any) -> None:
    page = workbench.new_page(viewport={"width": 390, "height": 844}, color_scheme="dark")
    open_session(page, session.pk)
    # Narrow: the sidebar is a drawer behind the menu button.
    assert not page.locator("#sidebar").is_visible() or page.locator("#sidebar").bounding_box()["x"] < 0
    send(page, "hello fast")
    wait_settled(page, 1)
    box = page.locator(".composer textarea")
    box.fill("/")
    palette = page.locator("[data-role=palette]")
    palette.locator("li[data-command='title']").wait_for()
    assert palette.locator("li[data-command='steer'] .cmd-hint").inner_text().strip() == "guidance"
    box.press("t")
    assert palette.locator("li").all_inner_texts()[0].startswith("/title")
    box.press("Tab")
    assert box.input_value() == "/title "
    workbench.screenshot(page, "11-phone-dark")
    page.locator("[data-role=open-nav]").click()
    page.locator("#sidebar .session.current").wait_for(state="visible")
    page.wait_for_function("() => document.getElementById('sidebar').getBoundingClientRect().left >= 0")
    workbench.screenshot(page, "12-phone-sidebar")


def test_reasoning_tools_plan_and_a_failed_run(workbench: Workbench, session: Any) -> None:
    page = workbench.new_page()
    open_session(page, session.pk)

    send(page, "think fast")
    settled = wait_settled(page, 1)
    reasoning = settled.locator("details.reasoning")
    assert reasoning.locator("summary").inner_text() == "Thought"
    assert not reasoning.locator(".reasoning-text").is_visible()
    reasoning.locator("summary").click()
    assert reasoning.locator(".reasoning-text").inner_text().strip()

    send(page, "tool fast")
    settled = wait_settled(page, 2)
    tool = settled.locator(".tool-card[data-tool-kind='execute']")
    assert tool.get_attribute("data-status") == "completed"
    tool.locator("details.tool-args summary").click()
    assert '"command": "ls"' in tool.locator("details.tool-args pre").inner_text()

    send(page, "plan fast")
    settled = wait_settled(page, 3)
    plan = settled.locator(".plan").last
    assert plan.locator("li[data-status='completed']").count() == 3
    assert plan.locator(".plan-count").inner_text() == "3/3"
    workbench.screenshot(page, "13-reasoning-tool-plan")

    send(page, "crash")
    settled = wait_settled(page, 4, "failed")
    banner = settled.locator(".turn-banner")
    assert banner.get_attribute("role") == "alert"
    assert banner.locator("strong").inner_text() == "Failed"
    assert "agent process died" in banner.inner_text()
    workbench.screenshot(page, "14-failed-run")


def test_a_message_goes_over_the_socket_and_again_over_http_when_its_answer_is_lost(
    workbench: Workbench, session: Any
) -> None:
    page = workbench.new_page()
    mode = {"submit": "pass"}
    submitted: list[dict[str, Any]] = []  # submit frames the page sent
    posted: list[dict[str, Any]] = []  # POSTs of messages that reached the route

    def socket_route(ws: Any) -> None:
        server = ws.connect_to_server()

        def to_server(message: str | bytes) -> None:
            frame = json.loads(message)
            if frame.get("type") == "submit":
                submitted.append(frame)
                if mode["submit"] == "drop":
                    ws.close()  # the socket dies as the message leaves: the server never sees it
                    return
            server.send(message)

        def to_page(message: str | bytes) -> None:
            if json.loads(message).get("type") == "submitted" and mode["submit"] == "lose_answer":
                ws.close()  # the server took the message; its answer dies with the socket
                return
            ws.send(message)

        ws.on_message(to_server)
        server.on_message(to_page)

    page.route_web_socket("**/ws/sessions/**", socket_route)
    open_session(page, session.pk)

    def drop_before_the_server(route: Any) -> None:
        posted.append(route.request.post_data_json)
        route.abort()

    # Neither way reaches the server: the message waits, marked, for a retry.
    mode["submit"] = "drop"
    page.route("**/api/sessions/*/messages", drop_before_the_server)
    send(page, "hello fast")
    page.locator(".outgoing[data-state='failed']").wait_for()
    workbench.screenshot(page, "15-message-not-sent")
    assert submitted[0]["client_id"] == posted[0]["client_id"]
    assert session.runs.count() == 0
    page.unroute("**/api/sessions/*/messages")

    def record(route: Any) -> None:
        posted.append(route.request.post_data_json)
        route.continue_()

    # Live again, the page sends it again by itself: over the socket, with the same client
    # id, and no HTTP request.
    mode["submit"] = "pass"
    page.route("**/api/sessions/*/messages", record)
    tried = len(posted)
    wait_settled(page, 1)
    assert len(submitted) >= 2
    assert {frame["client_id"] for frame in submitted} == {posted[0]["client_id"]}
    assert len(posted) == tried

    # The server took the message but its answer was lost: sent again over HTTP, the same
    # message to the server, so the turn still shows once.
    mode["submit"] = "lose_answer"
    send(page, "again fast")
    wait_settled(page, 2)
    page.unroute("**/api/sessions/*/messages")
    assert posted[-1]["client_id"] == submitted[-1]["client_id"]
    assert page.evaluate("sessionStorage.getItem('hermesweb.outbox.v1')") == "[]"
    page.reload()
    wait_settled(page, 2)
    assert page.locator(".user-text").all_inner_texts() == ["hello fast", "again fast"]
    assert session.runs.count() == 2


NOTIFICATION_STUB = """
window.__notes = [];
window.Notification = class {
  constructor(title, options) { window.__notes.push({ title, body: options && options.body }); }
  static get permission() { return 'granted'; }
  static requestPermission() { return Promise.resolve('granted'); }
};
Object.defineProperty(Document.prototype, 'hidden', {
  configurable: true,
  get() { return !!window.__hidden; },
});
"""


def test_notifications_while_the_tab_is_hidden(workbench: Workbench, session: Any) -> None:
    page = workbench.new_page()
    page.add_init_script(NOTIFICATION_STUB)
    open_session(page, session.pk)
    page.evaluate("window.__hidden = true")
    send(page, "approve fast")
    page.wait_for_function("() => window.__notes.some((n) => n.body.startsWith('Approval needed'))")
    # Hidden before the click, so the run cannot finish in between.
    page.locator(".approval-card[data-state='pending'] [data-option-id='allow_once']").dispatch_event("click")
    page.wait_for_function("() => window.__notes.some((n) => n.body === 'The run finished.')")
    page.evaluate("window.__hidden = false")
    wait_settled(page, 1)
    # A visible tab gets no notification.
    count = page.evaluate("window.__notes.length")
    send(page, "hello fast")
    wait_settled(page, 2)
    assert page.evaluate("window.__notes.length") == count
