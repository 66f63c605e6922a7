"""Recorded real-Hermes ACP traffic through the translator and the transcript, against golden files.

The traces (tests/fixtures/hermes/<scenario>.jsonl) were recorded from hermes-acp by
`python -m tests.support.record_hermes tests/fixtures/hermes` (see the README there). Each turn
of a trace is replayed the way the runner handles it (runs/runner/execution.py): a fresh
`Translator` per turn (per run), every `session/update` the agent sent while the prompt was in
flight fed to `translate()` as the agent's JSON, then `finish()`, `usage.final` from
`per_turn_usage` and the terminal `done`. Updates outside a turn (during session/new or
session/load, or after the prompt answered) reach no run, so they are listed, not journaled.

The events and `runs.transcript.materialize` of them are compared with
`<scenario>.events.json` and `<scenario>.transcript.json`: a new Hermes version (re-recorded
traces) or a translator change shows up as a diff. `HERMESWEB_UPDATE_GOLDENS=1` rewrites them.

Only the last test needs the agent (marked `hermes`): it records the `text` scenario live and
checks it still has the stored trace's shape.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from runs.agents import builtin_agents
from runs.journal import NewEvent, done_event
from runs.models import EventType, RunStatus
from runs.runner.translate import Translator, per_turn_usage
from runs.transcript import materialize
from tests.support.record_hermes import FIXTURES, SCENARIOS, load_trace, record

UPDATE = os.environ.get("HERMESWEB_UPDATE_GOLDENS") == "1"
TRACES = sorted(path.name.removesuffix(".jsonl") for path in FIXTURES.glob("*.jsonl"))
# The built-in `hermes` agent's setting: PromptResponse.usage is a running session total.
CUMULATIVE = bool(builtin_agents(Path("/nonexistent"))["hermes"]["cumulative_usage"])


# ------------------------------------------------------------------------------- replay


@dataclass
class Turn:
    process: int
    prompt: str
    updates: list[dict[str, Any]] = field(default_factory=list)
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    cancelled: bool = False


@dataclass
class Replay:
    turns: list[Turn] = field(default_factory=list)
    # Updates no run would journal: {"update": kind, "when": ..., "process": n}.
    outside: list[dict[str, Any]] = field(default_factory=list)


def split_turns(trace: list[dict[str, Any]]) -> Replay:
    """The trace's prompts with the updates that arrived while each was in flight."""
    replay = Replay()
    process = 1
    methods: dict[Any, str] = {}  # this process's client requests still unanswered, by id
    current: Turn | None = None
    for line in trace:
        if "spawn" in line:
            process, methods, current = line["spawn"], {}, None
            continue
        sender, method = line["from"], line.get("method")
        if sender == "client" and method is not None:
            if "id" in line:
                methods[line["id"]] = method
            if method == "session/prompt":
                prompt = "".join(block.get("text", "") for block in line["params"]["prompt"])
                current = Turn(process, prompt)
                replay.turns.append(current)
            elif method == "session/cancel" and current is not None:
                current.cancelled = True
        elif sender == "agent" and method is None:  # a response to one of our requests
            answered = methods.pop(line["id"], None)
            if answered == "session/prompt" and current is not None:
                current.result, current.error = line.get("result"), line.get("error")
                current = None
        elif sender == "agent" and method == "session/update":
            update = line["params"]["update"]
            if "session/load" in methods.values():
                replay.outside.append(
                    {"update": update["sessionUpdate"], "when": "during session/load", "process": process}
                )
            elif current is not None:
                current.updates.append(update)
            else:
                finished = len(replay.turns)
                when = f"after turn {finished}" if finished else "before the first turn"
                replay.outside.append({"update": update["sessionUpdate"], "when": when, "process": process})
    return replay


def _plain(value: Any) -> Any:
    """Enums and tuples to plain JSON, as the journal stores them."""
    return json.loads(json.dumps(value))


def _stable(payload: dict[str, Any]) -> dict[str, Any]:
    # The translator stamps wall-clock and monotonic times on tool events.
    out = dict(payload)
    if "started_at" in out:
        out["started_at"] = "<time>"
    if "duration" in out:
        out["duration"] = "<duration>"
    return out


def journal_turn(turn: Turn, previous_total: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The events the runner journals for this turn (RunExecution._complete / _finish_cancelled / _fail)."""
    translator = Translator()
    events: list[NewEvent] = []
    for update in turn.updates:
        events += translator.translate(update)
    if turn.result is not None:
        stop_reason = turn.result.get("stopReason", "end_turn")
        usage = per_turn_usage(turn.result.get("usage"), previous_total, CUMULATIVE)
        cancelled = stop_reason == "cancelled" or turn.cancelled
        events += [
            *translator.finish("cancelled" if cancelled else "turn_end"),
            NewEvent(EventType.USAGE_FINAL, {**usage, "context": translator.usage}),
            done_event(
                RunStatus.CANCELLED if cancelled else RunStatus.COMPLETED,
                stop_reason=stop_reason,
                usage=usage,
            ),
        ]
    elif turn.cancelled:  # Hermes 0.19 fails a prompt cancelled mid-tool with -32603
        events += [
            *translator.finish("cancelled"),
            done_event(
                RunStatus.CANCELLED,
                stop_reason="cancelled",
                reason="the agent failed the turn while cancelling",
            ),
        ]
    else:
        message = f"The agent failed the turn: {turn.error}"
        events += [
            *translator.finish("failed"),
            NewEvent(EventType.ERROR, {"code": "agent_error", "message": message, "terminal": True}),
            done_event(RunStatus.FAILED, reason=message, code="agent_error"),
        ]
    return [
        {"seq": seq, "type": event.type, "payload": _stable(event.payload), "terminal": event.terminal}
        for seq, event in enumerate(_plain_events(events), start=1)
    ]


def _plain_events(events: list[NewEvent]) -> list[NewEvent]:
    return [NewEvent(str(_plain(event.type)), _plain(event.payload)) for event in events]


def replay_scenario(name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(events golden, transcript golden) for one recorded trace."""
    replay = split_turns(load_trace(FIXTURES / f"{name}.jsonl"))
    turns, transcripts = [], []
    previous_total: dict[str, Any] | None = None
    for turn in replay.turns:
        events = journal_turn(turn, previous_total)
        if turn.result is not None and turn.result.get("usage"):
            previous_total = turn.result["usage"]  # the runner keeps it as the run's session_total
        outcome = {"result": turn.result} if turn.error is None else {"error": turn.error}
        turns.append(
            {
                "process": turn.process,
                "prompt": turn.prompt,
                "cancelled": turn.cancelled,
                **outcome,
                "updates": [update["sessionUpdate"] for update in turn.updates],
                "events": events,
            }
        )
        transcripts.append({"prompt": turn.prompt, "transcript": _plain(materialize(events))})
    return {"turns": turns, "not_journaled": replay.outside}, transcripts


# ------------------------------------------------------------------------------- goldens


def _dump(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"


def check_golden(path: Path, actual: Any) -> None:
    text = _dump(actual)
    if UPDATE:
        path.write_text(text)
        return
    if not path.exists():
        pytest.fail(f"{path.name} is missing: run with HERMESWEB_UPDATE_GOLDENS=1 to write it", pytrace=False)
    expected = path.read_text()
    if expected != text:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                text.splitlines(keepends=True),
                fromfile=f"{path.name} (golden)",
                tofile=f"{path.name} (now)",
            )
        )
        pytest.fail(
            f"{path.name} differs from the golden file (HERMESWEB_UPDATE_GOLDENS=1 rewrites it"
            f" if the change is intended):\n{diff}",
            pytrace=False,
        )


@pytest.mark.parametrize("scenario", TRACES)
def test_translated_events_match_the_golden_file(scenario: str) -> None:
    events, _ = replay_scenario(scenario)
    check_golden(FIXTURES / f"{scenario}.events.json", events)


@pytest.mark.parametrize("scenario", TRACES)
def test_materialized_transcript_matches_the_golden_file(scenario: str) -> None:
    _, transcripts = replay_scenario(scenario)
    check_golden(FIXTURES / f"{scenario}.transcript.json", transcripts)


def test_every_recorder_scenario_has_a_trace() -> None:
    assert sorted(SCENARIOS) == TRACES, "record the missing scenarios (tests/fixtures/hermes/README.md)"
    readme = (FIXTURES / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in SCENARIOS)


def _messages(name: str) -> list[dict[str, Any]]:
    return [line for line in load_trace(FIXTURES / f"{name}.jsonl") if "from" in line]


def test_the_traces_cover_every_update_kind_hermes_emits() -> None:
    kinds = {
        line["params"]["update"]["sessionUpdate"]
        for name in TRACES
        for line in _messages(name)
        if line.get("method") == "session/update"
    }
    assert kinds == {
        "agent_message_chunk",
        "agent_thought_chunk",
        "tool_call",
        "tool_call_update",
        "plan",
        "usage_update",
        "session_info_update",
        "available_commands_update",
        "user_message_chunk",
    }
    answers = {
        line["result"]["outcome"]["optionId"]
        for name in TRACES
        for line in _messages(name)
        if line["from"] == "client" and "outcome" in (line.get("result") or {})
    }
    assert answers == {"allow_once", "deny"}
    assert any(line.get("method") == "session/cancel" for line in _messages("cancel_tool"))


def test_plain_text_turn_is_one_text_item() -> None:
    """Hermes sends agent_message_chunk without messageId: the chunks are still one message."""
    chunks = [
        line["params"]["update"]
        for line in _messages("text")
        if line.get("method") == "session/update"
        and line["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
    ]
    assert len(chunks) > 1 and all("messageId" not in chunk for chunk in chunks)
    _, (turn,) = replay_scenario("text")
    texts = [item for item in turn["transcript"]["items"] if item["kind"] == "text"]
    assert len(texts) == 1, texts
    assert texts[0]["text"] == "".join(chunk["content"]["text"] for chunk in chunks)


def test_text_after_a_tool_call_is_a_new_text_item() -> None:
    _, (turn,) = replay_scenario("tool")
    assert [item["kind"] for item in turn["transcript"]["items"]] == ["tool", "text"]


# ------------------------------------------------------------------------------- live


def shape(trace: list[dict[str, Any]]) -> list[str]:
    """Who sent what, in order, with runs of the same update kind collapsed (chunk counts vary)."""
    out: list[str] = []
    for line in trace:
        if "spawn" in line:
            step = "spawn"
        elif line.get("method") == "session/update":
            step = f"{line['from']}: update {line['params']['update']['sessionUpdate']}"
        elif "method" in line:
            step = f"{line['from']}: {line['method']}"
        else:
            step = f"{line['from']}: {'error' if 'error' in line else 'result'}"
        if not out or out[-1] != step:
            out.append(step)
    return out


def _agent_info(trace: list[dict[str, Any]]) -> dict[str, Any]:
    return next(line["result"]["agentInfo"] for line in trace if "agentInfo" in (line.get("result") or {}))


def test_live_hermes_still_has_the_recorded_shape(hermes_acp_binary: Path) -> None:
    """Records `text` against the installed hermes-acp: a Hermes upgrade that changes it fails here."""
    stored = load_trace(FIXTURES / "text.jsonl")
    live = asyncio.run(record("text", hermes_acp_binary))
    upgraded = "another Hermes: re-record the traces (tests/fixtures/hermes/README.md)"
    assert _agent_info(live) == _agent_info(stored), upgraded
    assert shape(live) == shape(stored)
