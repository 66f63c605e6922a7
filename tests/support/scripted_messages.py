"""The Anthropic Messages API for the scripted model server (Claude speaks only this).

`tests/support/scripted_llm.py` routes `POST …/messages` here, with the same script words as
Chat Completions. Streaming: `message_start`, `content_block_start` (`thinking`, `text`,
`tool_use`), `content_block_delta` (`thinking_delta`, `text_delta`, `input_json_delta`),
`content_block_stop`, `message_delta` with the `stop_reason` and usage, `message_stop`. Without
`stream` (Claude's side calls) one JSON message.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

from tests.support.scripted_responses import Stream, pieces

USAGE = {
    "input_tokens": 10,
    "output_tokens": 5,
    "cache_creation_input_tokens": 0,
    "cache_read_input_tokens": 0,
}


def request_text(body: Mapping[str, Any]) -> str:
    """A Messages request's messages flattened (text, tool uses, tool results), for `in` assertions."""
    parts: list[str] = []
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            parts.append(content)
            continue
        for block in content or []:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text":
                parts.append(str(block.get("text", "")))
            elif kind == "tool_use":
                parts.append(f"{block.get('name', '')}({json.dumps(block.get('input', {}))})")
            elif kind == "tool_result":
                inner = block.get("content")
                if isinstance(inner, list):
                    parts.extend(str(b.get("text", "")) for b in inner if isinstance(b, dict))
                else:
                    parts.append(str(inner or ""))
    return "\n".join(parts)


def message(model: str, response: Any, message_id: str, tool_ids: list[str]) -> dict[str, Any]:
    """A whole (non-streamed) answer."""
    content: list[dict[str, Any]] = []
    if getattr(response, "text", ""):
        content.append({"type": "text", "text": response.text})
    for call, tool_id in zip(getattr(response, "calls", ()) or (), tool_ids, strict=False):
        content.append({"type": "tool_use", "id": tool_id, "name": call.name, "input": _input(call)})
    calls = getattr(response, "calls", None)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "tool_use" if calls else "end_turn",
        "stop_sequence": None,
        "usage": USAGE,
    }


def stream(out: Stream, response: Any) -> None:
    """One scripted answer (a TextResponse or ToolCallResponse) as a Messages SSE stream."""
    head = {"id": f"msg_{out.next_id()}", "type": "message", "role": "assistant", "model": out.model}
    start = {
        **head,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**USAGE, "output_tokens": 1},
    }
    out.event("message_start", {"message": start})
    index = 0
    chunks = getattr(response, "chunks", 1)
    if response.reasoning:
        _block(
            out,
            index,
            {"type": "thinking", "thinking": ""},
            "thinking_delta",
            "thinking",
            pieces(response.reasoning, chunks),
        )
        index += 1
    calls = getattr(response, "calls", None)
    if calls is None:
        _text(out, index, response.text, chunks, response.chunk_delay, response.gate)
    else:
        if response.text:
            _text(out, index, response.text, 1, 0.0, None)
            index += 1
        for call in calls:
            opened = {
                "type": "tool_use",
                "id": call.call_id or f"toolu_{out.next_id()}",
                "name": call.name,
                "input": {},
            }
            arguments = json.dumps(_input(call))
            _block(out, index, opened, "input_json_delta", "partial_json", pieces(arguments, 2))
            index += 1
    stop = "tool_use" if calls else "end_turn"
    out.event(
        "message_delta",
        {
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": USAGE["output_tokens"]},
        },
    )
    out.event("message_stop", {})


def _text(
    out: Stream, index: int, text: str, chunks: int, delay: float, gate: threading.Event | None
) -> None:
    out.event("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}})
    for number, piece in enumerate(pieces(text, chunks)):
        if number:
            out.pause(delay)
        out.event("content_block_delta", {"index": index, "delta": {"type": "text_delta", "text": piece}})
        if number == 0 and gate is not None:
            out.wait_gate(gate)
    out.event("content_block_stop", {"index": index})


def _block(out: Stream, index: int, opened: dict[str, Any], kind: str, key: str, deltas: list[str]) -> None:
    out.event("content_block_start", {"index": index, "content_block": opened})
    for piece in deltas:
        out.event("content_block_delta", {"index": index, "delta": {"type": kind, key: piece}})
    if opened["type"] == "thinking":
        out.event(
            "content_block_delta",
            {"index": index, "delta": {"type": "signature_delta", "signature": "scripted"}},
        )
    out.event("content_block_stop", {"index": index})


def _input(call: Any) -> dict[str, Any]:
    parsed = json.loads(call.arguments_json())
    return parsed if isinstance(parsed, dict) else {"input": parsed}
