"""Text from an agent that sends no messageId (Hermes) is one message until something else arrives."""

from __future__ import annotations

from typing import Any

from runs.runner.translate import Translator
from runs.transcript import materialize


def chunk(text: str, message_id: str | None = None) -> dict[str, Any]:
    update: dict[str, Any] = {
        "sessionUpdate": "agent_message_chunk",
        "content": {"type": "text", "text": text},
    }
    if message_id is not None:
        update["messageId"] = message_id
    return update


def thought(text: str) -> dict[str, Any]:
    return {"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": text}}


def tool(call_id: str) -> dict[str, Any]:
    return {"sessionUpdate": "tool_call", "toolCallId": call_id, "title": "ls", "status": "completed"}


def usage() -> dict[str, Any]:
    return {"sessionUpdate": "usage_update", "used": 10, "size": 1000}


def events_of(*updates: dict[str, Any]) -> list[dict[str, Any]]:
    translator = Translator()
    events = [event for update in updates for event in translator.translate(update)]
    events += translator.finish()
    return [{"seq": n, "type": e.type, "payload": e.payload} for n, e in enumerate(events, start=1)]


def texts(events: list[dict[str, Any]]) -> list[str]:
    return [item["text"] for item in materialize(events)["items"] if item["kind"] == "text"]


def test_consecutive_chunks_without_message_ids_are_one_message() -> None:
    events = events_of(chunk("Hello "), chunk("from "), chunk("the "), chunk("agent."))

    assert {e["payload"]["message_id"] for e in events} == {"m0"}
    assert texts(events) == ["Hello from the agent."]


def test_any_other_update_starts_a_new_message() -> None:
    events = events_of(
        chunk("Let me look. "),
        tool("t1"),
        chunk("Found it. "),
        chunk("Done."),
        thought("checking"),
        chunk("Really done."),
        usage(),
        chunk("Bye."),
    )

    assert texts(events) == ["Let me look. ", "Found it. Done.", "Really done.", "Bye."]
    ids = [e["payload"]["message_id"] for e in events if e["type"] == "token.delta"]
    assert len(set(ids)) == 4


def test_agent_message_ids_still_decide_when_the_agent_sends_them() -> None:
    events = events_of(chunk("a", "x1"), chunk("b", "x1"), chunk("c", "x2"))

    assert texts(events) == ["ab", "c"]
