"""Recorded real Codex and Claude ACP traffic through the translator and the transcript, against goldens.

The traces (tests/fixtures/npm_agents/<agent>_<scenario>.jsonl) were recorded by
`python -m tests.support.record_npm_agents` against the scripted model server (README there).
Each turn is replayed the way the runner handles it — the same replay as Hermes' traces
(tests/test_hermes_traces.py: a Translator per turn, `finish()`, `usage.final`, `done`), with
the usage of each turn its own (neither agent reports a running total) — and compared with
`<name>.events.json` and `<name>.transcript.json`; `HERMESWEB_UPDATE_GOLDENS=1` rewrites them.
The last test records `text` of each agent live and checks it still has the stored shape.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from runs.transcript import materialize
from tests.support.record_hermes import load_trace
from tests.support.record_npm_agents import AGENTS, FIXTURES, SCENARIOS, record
from tests.test_hermes_traces import check_golden, journal_turn, shape, split_turns

TRACES = sorted(path.name.removesuffix(".jsonl") for path in FIXTURES.glob("*.jsonl"))


def replay(name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    turns, transcripts = [], []
    replayed = split_turns(load_trace(FIXTURES / f"{name}.jsonl"))
    for turn in replayed.turns:
        events = journal_turn(turn, None)  # per-turn usage: no running total to subtract
        outcome = {"result": turn.result} if turn.error is None else {"error": turn.error}
        updates = [update["sessionUpdate"] for update in turn.updates]
        turns.append({"prompt": turn.prompt, "cancelled": turn.cancelled, **outcome, "updates": updates})
        turns[-1]["events"] = events
        transcripts.append({"prompt": turn.prompt, "transcript": json.loads(json.dumps(materialize(events)))})
    return {"turns": turns, "not_journaled": replayed.outside}, transcripts


@pytest.mark.parametrize("name", TRACES)
def test_translated_events_match_the_golden_file(name: str) -> None:
    events, _ = replay(name)
    check_golden(FIXTURES / f"{name}.events.json", events)


@pytest.mark.parametrize("name", TRACES)
def test_materialized_transcript_matches_the_golden_file(name: str) -> None:
    _, transcripts = replay(name)
    check_golden(FIXTURES / f"{name}.transcript.json", transcripts)


def test_every_agent_and_scenario_has_a_trace() -> None:
    assert sorted(f"{agent}_{scenario}" for agent in AGENTS for scenario in SCENARIOS) == TRACES


def items(name: str, turn: int = 0) -> list[dict[str, Any]]:
    _, transcripts = replay(name)
    return transcripts[turn]["transcript"]["items"]


def test_codex_opens_every_turn_with_its_unknown_model_warning_as_a_notice_not_text() -> None:
    texts = [item["text"] for item in items("codex_text") if item["kind"] == "text"]
    assert texts == ["Hello from the scripted model."]
    events, _ = replay("codex_text")
    notices = [e["payload"]["text"] for e in events["turns"][0]["events"] if e["type"] == "progress"]
    assert notices and notices[0].startswith("Warning: Model metadata for `mock-model` not found.")
    assert [item["kind"] for item in items("codex_text")].count("reasoning") == 1


def test_codexs_terminal_output_in_meta_is_journaled_as_the_cards_terminal() -> None:
    events, transcripts = replay("codex_tool")
    printed = [e["payload"] for e in events["turns"][0]["events"] if e["type"] == "terminal.output"]
    assert printed == [{"terminal_id": "call_tool_1", "delta": "TOOL-OUT\n"}]
    (tool,) = [item for item in items("codex_tool") if item["kind"] == "tool"]
    assert {"type": "terminal", "terminal_id": "call_tool_1"} in tool["content"]
    assert transcripts[0]["transcript"]["terminals"] == {"call_tool_1": "TOOL-OUT\n"}


def test_a_shell_tool_becomes_one_execute_card_then_the_answer() -> None:
    for agent in AGENTS:
        kinds = [item["kind"] for item in items(f"{agent}_tool")]
        tools = [item for item in items(f"{agent}_tool") if item["kind"] == "tool"]
        assert len(tools) == 1 and tools[0]["tool_kind"] == "execute", (agent, tools)
        assert tools[0]["status"] == "completed"
        assert kinds[-1] == "text", (agent, kinds)


def test_the_permission_options_are_the_agents_own() -> None:
    def options(name: str) -> list[tuple[str, str, str]]:
        for line in load_trace(FIXTURES / f"{name}.jsonl"):
            if line.get("method") == "session/request_permission":
                return [(o["optionId"], o["kind"], o["name"]) for o in line["params"]["options"]]
        raise AssertionError(f"no permission request in {name}")

    assert [(i, k) for i, k, _ in options("codex_permission")] == [
        ("allow_once", "allow_once"),
        ("accept_execpolicy_amendment", "allow_always"),
        ("cancel", "reject_once"),
    ]
    assert options("claude_permission") == [
        ("allow-once", "allow_once", "Yes"),
        ("reject", "reject_once", "No"),
    ]


def test_a_cancelled_turn_ends_cancelled_and_the_next_answers() -> None:
    for agent in AGENTS:
        events, _ = replay(f"{agent}_cancel")
        first, second = events["turns"]
        assert first["result"]["stopReason"] == "cancelled" and first["events"][-1]["type"] == "done"
        assert first["events"][-1]["payload"]["state"] == "cancelled"
        assert second["result"]["stopReason"] == "end_turn"


@pytest.mark.hermes
@pytest.mark.timeout(240)
@pytest.mark.parametrize("agent", AGENTS)
def test_the_installed_agent_still_has_the_recorded_shape(agent: str) -> None:
    """An upgrade of agents/package-lock.json that changes the traffic fails here: re-record."""
    stored = load_trace(FIXTURES / f"{agent}_text.jsonl")
    live = asyncio.run(record(agent, "text"))

    def info(trace: list[dict[str, Any]]) -> Any:
        return next(
            line["result"]["agentInfo"] for line in trace if "agentInfo" in (line.get("result") or {})
        )

    assert info(live) == info(stored), "another version: re-record (tests/fixtures/npm_agents/README.md)"
    # Titles and usage gauges arrive when the agent's side calls end: their place varies.
    assert shape(steady(live)) == shape(steady(stored))


def steady(trace: list[dict[str, Any]]) -> list[dict[str, Any]]:
    late = {"session_info_update", "usage_update"}
    return [
        line
        for line in trace
        if line.get("method") != "session/update" or line["params"]["update"]["sessionUpdate"] not in late
    ]


def test_the_fixtures_readme_names_how_to_record() -> None:
    readme = (Path(FIXTURES) / "README.md").read_text()
    assert "record_npm_agents" in readme and "HERMESWEB_UPDATE_GOLDENS" in readme
