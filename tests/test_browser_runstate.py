"""static/js/runstate.js folds events exactly as runs/transcript.py `materialize` does.

Item indexes key the rendered-markdown fragments, so the browser's state must
match the server's item for item. Runs in the real browser, with the module
served from disk (no web server needed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runs.transcript import materialize
from tests.support.browser import browser  # noqa: F401 - fixture

STATIC = Path(__file__).resolve().parent.parent / "static"
ORIGIN = "http://hermesweb.test"
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "journal_tool_turn.json"

EXTRA_EVENTS: list[dict[str, Any]] = [
    {"type": "run.started", "payload": {"status": "running"}},
    {"type": "token.delta", "payload": {"delta": "no message id "}},
    {"type": "token.delta", "payload": {"delta": "still none"}},
    {"type": "reasoning.delta", "payload": {"reasoning_id": "r1", "delta": "a"}},
    {"type": "reasoning.done", "payload": {"reasoning_id": "r1"}},
    {"type": "reasoning.delta", "payload": {"reasoning_id": "r1", "delta": "after done: a new block"}},
    {"type": "tool.updated", "payload": {"tool_call_id": "t9", "status": "in_progress", "content": []}},
    {
        "type": "tool.updated",
        "payload": {
            "tool_call_id": "t9",
            "content": [{"type": "diff", "path": "/p/a.txt", "old_text": None, "new_text": "x\n"}],
            "output": None,
        },
    },
    {
        "type": "tool.done",
        "payload": {"tool_call_id": "t9", "status": "failed", "error": True, "duration": 0.5},
    },
    {
        "type": "plan.updated",
        "payload": {"entries": [{"content": "A", "priority": "high", "status": "pending"}]},
    },
    {
        "type": "plan.updated",
        "payload": {"entries": [{"content": "A", "priority": "high", "status": "completed"}]},
    },
    {"type": "clarify.requested", "payload": {"clarify_id": "c1", "question": "Colour?", "schema": {}}},
    {
        "type": "clarify.resolved",
        "payload": {"clarify_id": "c1", "answer": {"answer": "teal"}, "outcome": "accepted"},
    },
    {"type": "approval.resolved", "payload": {"approval_id": "unknown", "option_id": "x"}},
    {"type": "steer.delivered", "payload": {"intent_id": 7, "text": "narrower"}},
    {"type": "title.updated", "payload": {"title": "A title"}},
    {"type": "usage.updated", "payload": {"used": 10, "size": 100}},
    {"type": "usage.updated", "payload": {"cost": {"amount": 0.1, "currency": "USD"}}},
    {"type": "progress", "payload": {"text": "halfway"}},
    {"type": "error", "payload": {"code": "x", "message": "boom", "terminal": True}},
    {
        "type": "files.restored",
        "payload": {
            "action": "rewind",
            "paths": ["a.txt"],
            "count": 1,
            "undo": 3,
            "undid": False,
            "forced": False,
        },
    },
    {"type": "terminal.output", "payload": {"terminal_id": "term-1", "delta": "\u001b[31mred\u001b[0m "}},
    {"type": "terminal.output", "payload": {"terminal_id": "term-1", "delta": "more"}},
    {"type": "usage.final", "payload": {"totalTokens": 3}},
    {"type": "done", "payload": {"state": "failed", "stop_reason": "refusal", "reason": "because"}},
]


def numbered(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"seq": seq, "terminal": e["type"] == "done", **e} for seq, e in enumerate(events, start=1)]


def server_state(events: list[dict[str, Any]]) -> dict[str, Any]:
    return json.loads(json.dumps(materialize(events)))


@pytest.fixture
def page(browser: Any) -> Any:
    context = browser.new_context()

    def serve(route: Any) -> None:
        path = route.request.url.removeprefix(ORIGIN)
        if path == "/":
            route.fulfill(body="<!doctype html><title>runstate</title>", content_type="text/html")
            return
        file = (STATIC / path.removeprefix("/static/")).resolve()
        if STATIC in file.parents and file.is_file():
            route.fulfill(body=file.read_text(), content_type="text/javascript")
        else:
            route.fulfill(status=404)

    context.route(f"{ORIGIN}/**", serve)
    page = context.new_page()
    page.goto(f"{ORIGIN}/")
    yield page
    context.close()


FOLD = """async ([events, start]) => {
    const { applyEvent, emptyState, relink } = await import('/static/js/runstate.js');
    const state = start ? relink(start) : emptyState();
    const touched = [];
    for (const event of events) touched.push(applyEvent(state, event) === null ? 'dup' : 'ok');
    return { state: JSON.parse(JSON.stringify(state)), touched };
}"""


@pytest.mark.parametrize("name", ["fixture", "extra"])
def test_the_browser_folds_events_like_the_server(page: Any, name: str) -> None:
    raw = json.loads(FIXTURE.read_text())["events"] if name == "fixture" else EXTRA_EVENTS
    events = numbered(raw)
    result = page.evaluate(FOLD, [events, None])
    assert result["state"] == server_state(events)


def test_a_state_from_the_transcript_keeps_folding_and_drops_replays(page: Any) -> None:
    events = numbered(json.loads(FIXTURE.read_text())["events"] + EXTRA_EVENTS[1:-1])
    half = len(events) // 2
    start = server_state(events[:half])
    # A replay overlap: the last three already-applied events come again first.
    result = page.evaluate(FOLD, [events[half - 3 :], start])
    assert result["touched"][:3] == ["dup", "dup", "dup"]
    assert result["state"] == server_state(events)
