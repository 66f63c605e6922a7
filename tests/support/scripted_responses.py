"""The OpenAI Responses API's stream for the scripted model server (Codex speaks only this).

`tests/support/scripted_llm.py` routes `POST …/responses` here; the script's words (`text`,
`reasoning`, `tool_call`) are the same as for Chat Completions, so one test can drive Hermes,
Codex and Claude alike. The events are the ones Codex reads: `response.created`,
`response.output_item.added`, `response.output_text.delta` (and
`response.reasoning_summary_text.delta`), `response.output_item.done` (a `message`, a
`reasoning` or a `function_call` with `name`, `arguments`, `call_id`), `response.completed` with
`usage`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol

USAGE = {
    "input_tokens": 10,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 5,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 15,
}


class Stream(Protocol):
    """What the server's handler offers a wire format: SSE events, pauses, gates, ids."""

    model: str

    def event(self, name: str, payload: Mapping[str, Any]) -> None: ...

    def pause(self, seconds: float) -> None: ...

    def wait_gate(self, gate: threading.Event) -> None: ...

    def next_id(self) -> int: ...


def pieces(message: str, count: int) -> list[str]:
    """`message` cut into `count` pieces (fewer for a short message), in order."""
    if count <= 1 or len(message) <= 1:
        return [message]
    count = min(count, len(message))
    size, extra = divmod(len(message), count)
    out, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        out.append(message[start:end])
        start = end
    return out


def request_text(body: Mapping[str, Any]) -> str:
    """A Responses request's instructions and input items flattened, for `in` assertions."""
    parts: list[str] = []
    items = body.get("input")
    if isinstance(items, str):
        return items
    for item in items or []:
        if not isinstance(item, dict):
            continue
        content = item.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(part.get("text", "")) for part in content if isinstance(part, dict))
        if item.get("type") == "function_call":
            parts.append(f"{item.get('name', '')}({item.get('arguments', '')})")
        if item.get("type") == "function_call_output":
            output = item.get("output")
            parts.append(output if isinstance(output, str) else str(output))
    return "\n".join(parts)


def stream(out: Stream, response: Any) -> None:
    """One scripted answer (a TextResponse or ToolCallResponse) as a Responses SSE stream."""
    response_id = f"resp_{out.next_id()}"
    created = int(time.time())
    head = {"id": response_id, "object": "response", "created_at": created, "model": out.model}
    out.event("response.created", {"response": {**head, "status": "in_progress", "output": []}})
    done: list[dict[str, Any]] = []
    if response.reasoning:
        done.append(_reasoning(out, len(done), response.reasoning, getattr(response, "chunks", 1)))
    calls = getattr(response, "calls", None)
    if calls is None:
        done.append(
            _message(out, len(done), response.text, response.chunks, response.chunk_delay, response.gate)
        )
    else:
        if response.text:
            done.append(_message(out, len(done), response.text, 1, 0.0, None))
        for call in calls:
            done.append(_function_call(out, len(done), call))
    final = {**head, "status": "completed", "output": done, "usage": USAGE}
    out.event("response.completed", {"response": final})


def _reasoning(out: Stream, index: int, thought: str, chunks: int) -> dict[str, Any]:
    item_id = f"rs_{out.next_id()}"
    out.event(
        "response.output_item.added",
        {"output_index": index, "item": {"type": "reasoning", "id": item_id, "summary": []}},
    )
    for piece in pieces(thought, chunks):
        delta = {"item_id": item_id, "output_index": index, "summary_index": 0, "delta": piece}
        out.event("response.reasoning_summary_text.delta", delta)
    item = {"type": "reasoning", "id": item_id, "summary": [{"type": "summary_text", "text": thought}]}
    out.event("response.output_item.done", {"output_index": index, "item": item})
    return item


def _message(
    out: Stream, index: int, message: str, chunks: int, delay: float, gate: threading.Event | None
) -> dict[str, Any]:
    item_id = f"msg_{out.next_id()}"
    opened = {"type": "message", "id": item_id, "status": "in_progress", "role": "assistant", "content": []}
    out.event("response.output_item.added", {"output_index": index, "item": opened})
    part = {"item_id": item_id, "output_index": index, "content_index": 0}
    out.event(
        "response.content_part.added",
        {**part, "part": {"type": "output_text", "text": "", "annotations": []}},
    )
    for number, piece in enumerate(pieces(message, chunks)):
        if number:
            out.pause(delay)
        out.event("response.output_text.delta", {**part, "delta": piece})
        if number == 0 and gate is not None:
            out.wait_gate(gate)
    text_part = {"type": "output_text", "text": message, "annotations": []}
    out.event("response.output_text.done", {**part, "text": message})
    out.event("response.content_part.done", {**part, "part": text_part})
    item = {**opened, "status": "completed", "content": [text_part]}
    out.event("response.output_item.done", {"output_index": index, "item": item})
    return item


def _function_call(out: Stream, index: int, call: Any) -> dict[str, Any]:
    item_id = f"fc_{out.next_id()}"
    call_id = call.call_id or f"call_{out.next_id()}"
    arguments = call.arguments_json()
    opened = {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": call.name,
        "arguments": "",
        "status": "in_progress",
    }
    out.event("response.output_item.added", {"output_index": index, "item": opened})
    delta = {"item_id": item_id, "output_index": index, "delta": arguments}
    out.event("response.function_call_arguments.delta", delta)
    out.event(
        "response.function_call_arguments.done",
        {"item_id": item_id, "output_index": index, "arguments": arguments},
    )
    item = {**opened, "arguments": arguments, "status": "completed"}
    out.event("response.output_item.done", {"output_index": index, "item": item})
    return item
