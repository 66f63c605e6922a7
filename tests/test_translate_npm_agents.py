"""What Codex and Claude send beside the plain protocol, translated (runs/runner/translate.py).

Codex streams a command's output in `_meta.terminal_output_delta` of its `tool_call_update`s
and ends it with `_meta.terminal_exit`; both agents send notices as `agent_message_chunk`
(Codex's unknown-model warning, Claude's `_meta.claudeCode.kind: "informational"`). The
shapes are the recorded ones (tests/fixtures/npm_agents/).
"""

from __future__ import annotations

from typing import Any

from acp import schema

from runs.runner.terminals import JOURNAL_CUT, JOURNAL_LIMIT
from runs.runner.translate import Translator
from runs.transcript import materialize

WARNING = (
    "Warning: Model metadata for `mock-model` not found. Defaulting to fallback metadata; "
    "this can degrade performance and cause issues.\n\n"
)


def codex_start(tool_id: str = "call_1") -> dict[str, Any]:
    return {
        "sessionUpdate": "tool_call",
        "toolCallId": tool_id,
        "kind": "execute",
        "title": "ls --color=always",
        "status": "in_progress",
        "content": [{"type": "terminal", "terminalId": tool_id}],
        "rawInput": {"command": "ls --color=always"},
        "_meta": {"terminal_info": {"cwd": "/w", "terminal_id": tool_id}},
    }


def output(data: str, tool_id: str = "call_1") -> dict[str, Any]:
    return {
        "sessionUpdate": "tool_call_update",
        "toolCallId": tool_id,
        "_meta": {"terminal_output_delta": {"data": data, "terminal_id": tool_id}},
    }


def exit_(code: int, tool_id: str = "call_1") -> dict[str, Any]:
    status = "completed" if code == 0 else "failed"
    return {
        "sessionUpdate": "tool_call_update",
        "toolCallId": tool_id,
        "status": status,
        "_meta": {"terminal_exit": {"exit_code": code, "signal": None, "terminal_id": tool_id}},
    }


def journal(updates: list[Any]) -> list[dict[str, Any]]:
    t = Translator()
    rows = []
    for update in updates:
        for event in t.translate(update):
            rows.append({"seq": len(rows) + 1, "type": str(event.type), "payload": event.payload})
    return rows


def test_codexs_streamed_output_becomes_terminal_output_of_its_card_ansi_kept() -> None:
    coloured = "\x1b[34mdocs\x1b[0m\n"
    rows = journal([codex_start(), output(coloured), output("README.md\n"), exit_(0)])
    assert [r["type"] for r in rows] == [
        "tool.started",
        "terminal.output",
        "terminal.output",
        "tool.updated",
        "tool.done",
    ]
    state = materialize(rows)
    assert state["terminals"] == {"call_1": coloured + "README.md\n"}  # the browser draws the escapes
    (tool,) = [item for item in state["items"] if item["kind"] == "tool"]
    assert {"type": "terminal", "terminal_id": "call_1"} in tool["content"]


def test_an_update_with_only_terminal_meta_adds_no_empty_tool_row() -> None:
    rows = journal([codex_start(), output("a\n")])
    assert "tool.updated" not in [r["type"] for r in rows]


def test_a_failed_exit_is_printed_at_the_end_of_the_terminal() -> None:
    rows = journal([codex_start(), output("boom\n"), exit_(2)])
    printed = "".join(r["payload"]["delta"] for r in rows if r["type"] == "terminal.output")
    assert printed == "boom\n\n[exit code 2]\n"
    assert rows[-1]["payload"]["status"] == "failed"


def test_a_terminals_journaled_output_is_capped_as_the_client_terminals_are() -> None:
    big = "x" * (JOURNAL_LIMIT // 2 + 10)
    rows = journal([codex_start(), output(big), output(big), output("more")])
    printed = "".join(r["payload"]["delta"] for r in rows if r["type"] == "terminal.output")
    assert printed.endswith(JOURNAL_CUT)
    assert len(printed) == JOURNAL_LIMIT + len(JOURNAL_CUT)


def test_codexs_unknown_model_warning_is_a_notice_not_the_answer() -> None:
    rows = journal(
        [
            {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": WARNING}},
            {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": "Hello."},
                "messageId": "m",
            },
        ]
    )
    assert [r["type"] for r in rows] == ["progress", "token.delta"]
    assert rows[0]["payload"]["text"] == WARNING.strip()
    state = materialize(rows)
    assert state["text"] == "Hello."
    assert state["progress"] == WARNING.strip()


def test_claudes_informational_chunk_is_a_notice_not_the_answer() -> None:
    # The SDK model, as the runner receives it: `_meta` set, so it takes the model_dump path.
    informational = schema.AgentMessageChunk(
        session_update="agent_message_chunk",
        content=schema.TextContentBlock(type="text", text="**Notice:** billed through the gateway"),
        field_meta={"claudeCode": {"kind": "informational", "level": "notice"}},
    )
    answer = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "Done."}}
    rows = journal([answer, informational])
    assert [r["type"] for r in rows] == ["token.delta", "progress"]
    assert materialize(rows)["text"] == "Done."


def test_a_warning_quoted_inside_an_answer_stays_text() -> None:
    said = "Codex said: Warning: Model metadata for `x` not found."
    rows = journal([{"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": said}}])
    assert [r["type"] for r in rows] == ["token.delta"]
