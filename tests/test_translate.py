"""The ACP → journal translation table, without an agent."""

from __future__ import annotations

from typing import Any

import pytest
from acp import helpers, schema

from runs.runner.translate import Translator, as_dict, per_turn_usage


def chunk(kind: str, text: str, message_id: str | None = None) -> dict:
    update = {"sessionUpdate": kind, "content": {"type": "text", "text": text}}
    if message_id:
        update["messageId"] = message_id
    return update


def test_agent_message_chunks_become_token_deltas_with_their_message_id() -> None:
    t = Translator()
    (event,) = t.translate(chunk("agent_message_chunk", "Hello", "m-1"))
    assert (event.type, event.payload["delta"], event.payload["message_id"]) == (
        "token.delta",
        "Hello",
        "m-1",
    )


def test_thought_chunks_become_reasoning_closed_when_text_resumes() -> None:
    t = Translator()
    first = t.translate(chunk("agent_thought_chunk", "hmm"))
    second = t.translate(chunk("agent_message_chunk", "answer"))
    assert [e.type for e in first] == ["reasoning.delta"]
    assert [e.type for e in second] == ["reasoning.done", "token.delta"]


def test_reasoning_still_open_at_turn_end_is_closed() -> None:
    t = Translator()
    t.translate(chunk("agent_thought_chunk", "hmm"))
    assert [e.type for e in t.finish()] == ["reasoning.done"]


def test_tool_call_lifecycle_maps_to_started_updated_done() -> None:
    t = Translator()
    started = t.translate(
        {"sessionUpdate": "tool_call", "toolCallId": "t1", "title": "ls", "kind": "execute",
         "status": "in_progress", "rawInput": {"command": "ls"}}
    )  # fmt: skip
    updated = t.translate(
        {"sessionUpdate": "tool_call_update", "toolCallId": "t1",
         "content": [{"type": "content", "content": {"type": "text", "text": "a.txt"}}]}
    )  # fmt: skip
    done = t.translate({"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed"})
    assert [e.type for e in started] == ["tool.started"]
    assert (
        started[0].payload["arguments"] == {"command": "ls"} and started[0].payload["tool_kind"] == "execute"
    )
    assert [e.type for e in updated] == ["tool.updated"]
    assert updated[0].payload["content"] == [{"type": "text", "text": "a.txt"}]
    assert [e.type for e in done] == ["tool.updated", "tool.done"]
    assert done[-1].payload["status"] == "completed" and done[-1].payload["error"] is False


def test_diff_content_is_kept_for_the_edit_card() -> None:
    t = Translator()
    (event,) = t.translate(
        {"sessionUpdate": "tool_call", "toolCallId": "e1", "kind": "edit",
         "content": [{"type": "diff", "path": "/p/a.txt", "oldText": "a", "newText": "b"}]}
    )  # fmt: skip
    assert event.payload["content"] == [
        {"type": "diff", "path": "/p/a.txt", "old_text": "a", "new_text": "b"}
    ]


def test_tool_calls_the_agent_never_completes_are_closed_at_turn_end() -> None:
    t = Translator()
    t.translate(
        {"sessionUpdate": "tool_call", "toolCallId": "w1", "title": "write_file", "status": "in_progress"}
    )
    (closed,) = t.finish()
    assert closed.type == "tool.done" and closed.payload["tool_call_id"] == "w1"
    assert closed.payload["closed_by"] == "turn_end"


def test_plan_usage_and_title_updates() -> None:
    t = Translator()
    (plan,) = t.translate(
        {"sessionUpdate": "plan", "entries": [{"content": "Read", "priority": "high", "status": "pending"}]}
    )
    (usage,) = t.translate({"sessionUpdate": "usage_update", "used": 10, "size": 100})
    (title,) = t.translate({"sessionUpdate": "session_info_update", "title": "Fix the bug"})
    assert plan.type == "plan.updated" and plan.payload["entries"][0]["content"] == "Read"
    assert usage.type == "usage.updated" and usage.payload == {"used": 10, "size": 100}
    assert title.type == "title.updated" and t.title == "Fix the bug"


def test_available_commands_are_remembered_not_journaled() -> None:
    t = Translator()
    command = {"name": "steer", "description": "Guide", "input": {"hint": "guidance"}}
    update = {"sessionUpdate": "available_commands_update", "availableCommands": [command]}
    assert t.translate(update) == []
    assert t.commands == [{"name": "steer", "description": "Guide", "input_hint": "guidance"}]


def test_user_message_replays_are_ignored() -> None:
    assert Translator().translate(chunk("user_message_chunk", "old prompt")) == []


def test_huge_tool_output_is_truncated() -> None:
    t = Translator()
    big = "x" * 200_000
    (event,) = t.translate(
        {"sessionUpdate": "tool_call", "toolCallId": "big",
         "content": [{"type": "content", "content": {"type": "text", "text": big}}]}
    )  # fmt: skip
    assert len(event.payload["content"][0]["text"]) < 70_000


def test_cumulative_usage_is_stored_per_turn_as_the_difference() -> None:
    assert per_turn_usage({"totalTokens": 150}, {"totalTokens": 100}, cumulative=True) == {"totalTokens": 50}
    assert per_turn_usage({"totalTokens": 150}, {"totalTokens": 100}, cumulative=False) == {
        "totalTokens": 150
    }
    assert per_turn_usage({"totalTokens": 150}, None, cumulative=True) == {"totalTokens": 150}


@pytest.mark.parametrize(
    "update",
    [
        helpers.update_agent_message_text("plain"),
        helpers.update_agent_thought_text("thinking"),
        schema.AgentMessageChunk(
            session_update="agent_message_chunk", content=helpers.text_block("with id"), message_id="m-7"
        ),
        schema.AgentMessageChunk(
            session_update="agent_message_chunk",
            content=schema.TextContentBlock(
                type="text", text="annotated", annotations=schema.Annotations(priority=1)
            ),
        ),
        schema.AgentMessageChunk(
            session_update="agent_message_chunk", content=helpers.text_block("meta"), field_meta={"k": 1}
        ),
        helpers.update_agent_message(helpers.resource_link_block("file.txt", "file:///file.txt")),
    ],
)
def test_as_dict_gives_what_model_dump_gives(update: Any) -> None:
    assert as_dict(update) == update.model_dump(by_alias=True, exclude_none=True, mode="json")
