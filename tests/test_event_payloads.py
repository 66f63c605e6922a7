"""Every journal event type has one declared payload, and what the journal holds keeps to it.

The declarations are runs/journal/payloads.py's (`EVENTS`); docs/journal.md ("Event types")
lists them from the same source. Checked here: every type has one; the recorded fixtures (the
hand-written tool turn and Hermes' recorded traces, tests/fixtures/) and the events of real
demo-agent turns validate against them; the doc's table is the one the module prints.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, is_typeddict

import pytest

from runs.controls import do_cancel, do_respond_approval, do_respond_clarify
from runs.journal import NewEvent, payloads
from runs.journal.payloads import EVENTS, PAYLOADS, payload_errors, payload_table
from runs.models import EventType, RunStatus
from runs.runner.translate import Translator
from runs.transcript import TOOL_CARD_FIELDS
from tests import factories
from tests.support.procs import Proc, start_runner
from tests.support.runs import events, run_of, submit, wait_event, wait_status

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
JOURNAL_DOC = REPO / "docs" / "journal.md"
UPDATE = os.environ.get("HERMESWEB_UPDATE_GOLDENS") == "1"
TABLE_START, TABLE_END = "<!-- event-payloads: start -->", "<!-- event-payloads: end -->"


def assert_valid(recorded: list[dict[str, Any]], source: str) -> None:
    """Each event's payload conforms to its type's declaration; every fault is listed."""
    faults = [
        f"{source} #{i} {event['type']}: {error}"
        for i, event in enumerate(recorded)
        for error in payload_errors(event["type"], event["payload"])
    ]
    assert faults == [], "\n".join(faults)


# ------------------------------------------------------------------- the declarations


def test_every_event_type_has_one_declared_payload() -> None:
    assert list(EVENTS) == list(EventType)
    assert all(is_typeddict(declared) for declared in PAYLOADS.values())
    assert len(set(PAYLOADS.values())) == len(PAYLOADS), "one payload class per type"


def test_the_readers_event_sets_are_the_ones_they_kept_before() -> None:
    # Derived from EVENTS now: the same sets the feed, the writer and compaction spelled out.
    snapshot = {"run.started", "status", "done", "title.updated"}
    sidebar = {
        "run.started",
        "status",
        "approval.requested",
        "approval.resolved",
        "clarify.requested",
        "clarify.resolved",
        "title.updated",
        "done",
    }
    segments = {
        "token.delta": "message_id",
        "reasoning.delta": "reasoning_id",
        "terminal.output": "terminal_id",  # ACP terminals' output (runs/runner/terminals.py)
    }
    assert (snapshot, sidebar) == (payloads.SESSION_STATE_EVENTS, payloads.SIDEBAR_EVENTS)
    assert segments == payloads.DELTA_SEGMENT_KEYS


def test_the_fold_reads_only_declared_tool_fields() -> None:
    tool_types = (payloads.ToolStarted, payloads.ToolUpdated, payloads.ToolDone)
    declared = set().union(*(t.__required_keys__ | t.__optional_keys__ for t in tool_types))
    assert set(TOOL_CARD_FIELDS) <= declared


def test_the_check_names_what_is_wrong() -> None:
    assert payload_errors("token.delta", {"message_id": "m1", "delta": "hi"}) == []
    assert payload_errors("token.delta", {"delta": 3, "extra": True}) == [
        "payload: 'message_id' is missing",
        "payload.delta: 3 is not a str",
        "payload: 'extra' is not declared by TokenDelta",
    ]
    assert payload_errors("tool.done", {"tool_call_id": "t", "status": "completed", "duration": 2}) == []
    assert payload_errors("tool.done", {"tool_call_id": "t", "status": "completed", "error": 1}) == [
        "payload.error: 1 is not a bool"
    ]
    bad_diff = {"tool_call_id": "t", "content": [{"type": "diff", "path": "a"}]}
    assert payload_errors("tool.updated", bad_diff)  # old_text and new_text are missing
    # Usage carries the agent's own keys.
    assert payload_errors("usage.final", {"inputTokens": 3, "context": {"used": 1}}) == []
    assert payload_errors("no.such", {}) == ["'no.such' is not an event type with a declared payload"]


# ------------------------------------------------------------------- recorded journals


def test_the_recorded_tool_turn_keeps_to_the_declarations() -> None:
    recorded = json.loads((FIXTURES / "journal_tool_turn.json").read_text())["events"]
    assert_valid(recorded, "journal_tool_turn.json")


def _golden_events(path: Path) -> list[dict[str, Any]]:
    # The goldens write the translator's clock readings as placeholders (test_hermes_traces._stable).
    placeholders = {"started_at": "<time>", "duration": "<duration>"}
    out = []
    for turn in json.loads(path.read_text())["turns"]:
        for event in turn["events"]:
            payload = {k: 0.0 if placeholders.get(k) == v else v for k, v in event["payload"].items()}
            out.append({**event, "payload": payload})
    return out


@pytest.mark.parametrize("golden", sorted(p.name for p in (FIXTURES / "hermes").glob("*.events.json")))
def test_hermes_recorded_events_keep_to_the_declarations(golden: str) -> None:
    recorded = _golden_events(FIXTURES / "hermes" / golden)
    assert recorded
    assert_valid(recorded, golden)


def test_translated_updates_of_every_kind_keep_to_the_declarations() -> None:
    # What the demo agent and the Hermes traces do not send: terminal content, a diff, a
    # restarted tool call, an update for an unseen call, costs.
    translator = Translator()
    updates = [
        {"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "hm"}},
        {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "hi"}},
        {
            "sessionUpdate": "tool_call",
            "toolCallId": "t1",
            "title": "edit",
            "kind": "edit",
            "rawInput": {"path": "a"},
            "locations": [{"path": "a", "line": 1}],
            "content": [
                {"type": "diff", "path": "a", "newText": "x"},
                {"type": "terminal", "terminalId": "term-1"},
                {"type": "content", "content": {"type": "text", "text": "ok"}},
            ],
        },
        {"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "edit again"},
        {"sessionUpdate": "tool_call_update", "toolCallId": "t2", "status": "failed", "rawOutput": {"e": 1}},
        {"sessionUpdate": "plan", "entries": [{"content": "a", "priority": "high", "status": "pending"}]},
        {"sessionUpdate": "usage_update", "used": 10, "size": 100, "cost": {"amount": 0.1, "currency": "$"}},
        {"sessionUpdate": "session_info_update", "title": "A title"},
    ]
    produced: list[NewEvent] = []
    for update in updates:
        produced += translator.translate(update)
    produced += translator.finish("cancelled")
    kinds = {event.type for event in produced}
    assert {"tool.started", "tool.updated", "tool.done", "plan.updated", "usage.updated"} <= kinds
    assert_valid([{"type": e.type, "payload": e.payload} for e in produced], "translated")


# ------------------------------------------------------------------- a real agent's turns


@pytest.fixture
def runner(runners: list[Proc], logs: Path) -> Proc:
    proc = start_runner(logs, "payloads", HERMESWEB_DEMO_DELAY="0.002")
    runners.append(proc)
    return proc


@pytest.mark.timeout(180)
@pytest.mark.django_db(transaction=True)
def test_demo_agent_turns_keep_to_the_declarations(runner: Proc) -> None:
    session = factories.SessionFactory(project__agent="demo")
    recorded: list[dict[str, Any]] = []

    def turn(text: str, *, answer: Any = None, end: str = RunStatus.COMPLETED) -> None:
        run = run_of(submit(session, text))
        if answer is not None:
            answer(run)
        wait_status(run, end, log=runner.log)
        recorded.extend({"type": e.type, "payload": e.payload} for e in events(run))

    def approve(run: Any) -> None:
        wait_status(run, RunStatus.AWAITING_APPROVAL, log=runner.log)
        request = wait_event(run, "approval.requested")
        assert do_respond_approval(run, request.payload["approval_id"], "allow_once").status == "accepted"

    def clarify(run: Any) -> None:
        wait_status(run, RunStatus.AWAITING_CLARIFY, log=runner.log)
        request = wait_event(run, "clarify.requested")
        assert do_respond_clarify(run, request.payload["clarify_id"], "teal").status == "accepted"

    def cancel(run: Any) -> None:
        wait_event(run, "token.delta")
        assert do_cancel(run).status == "accepted"

    turn("think about it fast")
    turn("show me a tool fast")
    turn("make a plan fast")
    turn("edit the file fast", answer=approve)
    turn("ask me fast", answer=clarify)
    turn("/title Typed payloads")
    turn("/mode accept_edits")  # the agent switches mode itself: a progress event, written beside the turn
    turn("hold on", answer=cancel, end=RunStatus.CANCELLED)
    turn("crash now", end=RunStatus.FAILED)
    seen = {event["type"] for event in recorded}
    assert {
        "run.started",
        "status",
        "token.delta",
        "reasoning.delta",
        "reasoning.done",
        "tool.started",
        "tool.updated",
        "tool.done",
        "plan.updated",
        "approval.requested",
        "approval.resolved",
        "clarify.requested",
        "clarify.resolved",
        "title.updated",
        "usage.updated",
        "usage.final",
        "error",
        "done",
    } <= seen, seen
    assert_valid(recorded, "demo agent")


# ------------------------------------------------------------------- docs/journal.md


def test_the_journal_doc_lists_the_declared_payloads() -> None:
    text = JOURNAL_DOC.read_text()
    found = re.search(re.escape(TABLE_START) + r"\n(.*?)" + re.escape(TABLE_END), text, re.S)
    assert found, f"docs/journal.md has no {TABLE_START} … {TABLE_END} section"
    expected = payload_table()
    if UPDATE and found.group(1) != expected:
        JOURNAL_DOC.write_text(text[: found.start(1)] + expected + text[found.end(1) :])
        return
    assert found.group(1) == expected, (
        "docs/journal.md's event table differs from runs/journal/payloads.py "
        "(HERMESWEB_UPDATE_GOLDENS=1 rewrites it); it should read:\n\n" + expected
    )
