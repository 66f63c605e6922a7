"""A scripted OpenAI-compatible chat-completions server for tests.

Real agents (Hermes) are pointed at it instead of a model provider, so tests run offline and decide
exactly what "the model" says. Each streaming chat completion consumes the next scripted response;
when the script is empty a default text is streamed. Non-streaming completions are the agent's side
calls (session titles, compaction); they get a short fixed answer and leave the script alone, so
the script only describes the conversation the test cares about.

Usage::

    with ScriptedLLM() as llm:
        llm.enqueue(tool_call("terminal", {"command": "ls"}))
        llm.enqueue("All done.")
        ...  # point the agent at llm.base_url
        first, second = llm.wait_for_requests(2, scripted_only=True)
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from tests.support import scripted_messages, scripted_responses

DEFAULT_MODEL = "mock-model"
DEFAULT_TEXT = "OK."
SIDE_CALL_TEXT = "Scripted title"
# A gated stream that nobody releases must not hang a test run forever.
GATE_TIMEOUT = 120.0


@dataclass(frozen=True)
class TextResponse:
    """An assistant text answer, optionally preceded by reasoning.

    ``chunks`` splits the text into that many SSE deltas with ``chunk_delay`` seconds between them.
    ``gate``, when given, is waited on after the first text chunk has been sent: a test can cancel
    the turn while the answer is provably mid-stream, then set the gate to let the stream finish.
    """

    text: str
    chunks: int = 1
    chunk_delay: float = 0.0
    reasoning: str | None = None
    gate: threading.Event | None = None


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: Mapping[str, Any] | str
    call_id: str | None = None

    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments)


@dataclass(frozen=True)
class ToolCallResponse:
    """One assistant message that asks for one or more tool calls (finish_reason ``tool_calls``).

    The agent runs the tools itself and then makes another chat completion carrying the results,
    which consumes the next scripted response.
    """

    calls: tuple[ToolCall, ...]
    text: str = ""
    reasoning: str | None = None


@dataclass(frozen=True)
class ErrorResponse:
    """An HTTP error instead of a completion (agents typically retry, then report the failure)."""

    status: int = 500
    message: str = "scripted failure"


Response = TextResponse | ToolCallResponse | ErrorResponse


def text(
    message: str, *, chunks: int = 1, chunk_delay: float = 0.0, gate: threading.Event | None = None
) -> TextResponse:
    return TextResponse(message, chunks=chunks, chunk_delay=chunk_delay, gate=gate)


def reasoning(thought: str, message: str, *, chunks: int = 1, chunk_delay: float = 0.0) -> TextResponse:
    return TextResponse(message, chunks=chunks, chunk_delay=chunk_delay, reasoning=thought)


def tool_call(
    name: str, arguments: Mapping[str, Any] | str, *, call_id: str | None = None, text: str = ""
) -> ToolCallResponse:
    return ToolCallResponse(calls=(ToolCall(name, arguments, call_id),), text=text)


def request_text(body: Mapping[str, Any]) -> str:
    """Flatten every message of a recorded request into one string, for ``in`` assertions."""
    # The Responses API (Codex) sends `input` items, the Messages API (Claude) content blocks.
    if "input" in body:
        return scripted_responses.request_text(body)
    if "system" in body or _has_blocks(body, {"tool_use", "tool_result", "thinking"}):
        return scripted_messages.request_text(body)
    parts: list[str] = []
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(part.get("text", "")) for part in content if isinstance(part, dict))
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            parts.append(f"{function.get('name', '')}({function.get('arguments', '')})")
    return "\n".join(parts)


def _has_blocks(body: Mapping[str, Any], kinds: set[str]) -> bool:
    for message in body.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") in kinds for b in content):
            return True
    return False


def _split(message: str, pieces: int) -> list[str]:
    if pieces <= 1 or len(message) <= 1:
        return [message]
    pieces = min(pieces, len(message))
    size, extra = divmod(len(message), pieces)
    out: list[str] = []
    start = 0
    for index in range(pieces):
        end = start + size + (1 if index < extra else 0)
        out.append(message[start:end])
        start = end
    return out


@dataclass
class _State:
    script: deque[Response] = field(default_factory=deque)
    # (text the request must hold, the answer): taken, once, before the script.
    replies: list[tuple[str, Response]] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    scripted_requests: list[dict[str, Any]] = field(default_factory=list)
    other_requests: list[tuple[str, str]] = field(default_factory=list)


class ScriptedLLM:
    """OpenAI-compatible server on 127.0.0.1 (ephemeral port) answering from a script.

    Thread-safe: the HTTP handler threads and the test thread share state under one condition
    variable, which also lets tests wait for the Nth request instead of sleeping.
    """

    def __init__(self, *, default_text: str = DEFAULT_TEXT, model: str = DEFAULT_MODEL) -> None:
        self.default_text = default_text
        self.model = model
        # Other model ids a test lets the user choose: their streamed requests take the script too.
        self.conversation_models: set[str] = set()
        self._cond = threading.Condition()
        self._state = _State()
        self._ids = itertools.count(1)
        self._stopped = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> ScriptedLLM:
        if self._server is not None:
            return self
        server = _Server(("127.0.0.1", 0), _Handler)
        server.llm = self
        self._server = server
        # shutdown() waits for serve_forever's next poll: at the default 0.5 s, up to half a
        # second of every Hermes test's teardown.
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="scripted-llm", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        self._stopped.set()
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> ScriptedLLM:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("ScriptedLLM is not running")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- script --------------------------------------------------------------------------------

    def enqueue(self, *responses: Response | str) -> None:
        """Append responses to the script; a plain string is a one-chunk text answer."""
        with self._cond:
            for response in responses:
                self._state.script.append(TextResponse(response) if isinstance(response, str) else response)

    def reply_to(self, holding: str, response: Response | str) -> None:
        """Answer the first request whose messages hold `holding` with `response`, once, ahead of the
        script: for a turn whose request may race another process's (a jammed agent's late one)."""
        with self._cond:
            self._state.replies.append(
                (holding, TextResponse(response) if isinstance(response, str) else response)
            )

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._state.script)

    # -- recorded requests ---------------------------------------------------------------------

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every chat-completion request body received, side calls included, in arrival order."""
        with self._cond:
            return list(self._state.requests)

    @property
    def scripted_requests(self) -> list[dict[str, Any]]:
        """The request bodies that were answered from the script (or the default text)."""
        with self._cond:
            return list(self._state.scripted_requests)

    @property
    def other_requests(self) -> list[tuple[str, str]]:
        """(method, path) of requests that were not chat completions, for diagnosing agents."""
        with self._cond:
            return list(self._state.other_requests)

    def wait_for_requests(
        self, count: int, *, timeout: float = 60.0, scripted_only: bool = False
    ) -> list[dict[str, Any]]:
        """Block until at least ``count`` requests arrived; return them all (a snapshot)."""

        def ready() -> bool:
            return len(self._pick(scripted_only)) >= count

        with self._cond:
            if not self._cond.wait_for(ready, timeout=timeout):
                got = len(self._pick(scripted_only))
                raise TimeoutError(f"waited {timeout}s for {count} LLM requests, got {got}")
            return list(self._pick(scripted_only))

    def is_conversation(self, body: Mapping[str, Any], wire: str = "chat") -> bool:
        """Whether a streamed request is the conversation (it takes the script) or a side call.

        Codex and Claude stream their side calls too (titles, a background call), under another
        model id or without tools; Chat Completions (Hermes) streams only the conversation.
        """
        if wire == "chat":
            return True
        # Codex's side calls (titles, its guardian) ask for structured output: `text.format`.
        structured = bool((body.get("text") or {}).get("format"))
        if body.get("model") in self.conversation_models:
            return not structured  # Codex sends some chosen models no tools, and `text.verbosity`
        return body.get("model") == self.model and bool(body.get("tools")) and "text" not in body

    def _pick(self, scripted_only: bool) -> list[dict[str, Any]]:
        return self._state.scripted_requests if scripted_only else self._state.requests

    # -- used by the handler -------------------------------------------------------------------

    def _record(self, body: dict[str, Any], *, scripted: bool) -> Response:
        with self._cond:
            self._state.requests.append(body)
            if scripted:
                self._state.scripted_requests.append(body)
                response: Response = self._reply(body) or (
                    self._state.script.popleft() if self._state.script else TextResponse(self.default_text)
                )
            else:
                response = TextResponse(SIDE_CALL_TEXT)
            self._cond.notify_all()
            return response

    def _reply(self, body: dict[str, Any]) -> Response | None:
        replies = self._state.replies
        if replies:
            held = request_text(body)
            for index, (holding, response) in enumerate(replies):
                if holding in held:
                    del replies[index]
                    return response
        return None

    def _record_other(self, method: str, path: str) -> None:
        with self._cond:
            self._state.other_requests.append((method, path))
            self._cond.notify_all()

    def _next_id(self) -> int:
        return next(self._ids)

    def _wait_gate(self, gate: threading.Event) -> None:
        deadline = time.monotonic() + GATE_TIMEOUT
        # Slices so that stop() releases a stream whose gate the test never opened.
        while not gate.wait(0.05):
            if self._stopped.is_set() or time.monotonic() > deadline:
                return


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    llm: ScriptedLLM

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Agents hang up mid-stream when a turn is cancelled; that is expected, not an error.
        pass


class _Disconnected(Exception):
    pass


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # -- routing -------------------------------------------------------------------------------

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path.endswith("/models"):
            llm = self.server.llm
            llm._record_other("GET", self.path)
            self._send_json(
                200,
                {
                    "object": "list",
                    "data": [{"id": llm.model, "object": "model", "created": 0, "owned_by": "scripted"}],
                },
            )
            return
        self._not_found("GET")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if path.endswith("/messages/count_tokens"):
            self.server.llm._record_other("POST", self.path)
            self._send_json(200, {"input_tokens": 10})
            return
        # Chat Completions (Hermes), Responses (Codex), Messages (Claude): the same script.
        wire = (
            "responses"
            if path.endswith("/responses")
            else "messages"
            if path.endswith("/messages")
            else "chat"
        )
        if wire == "chat" and not path.endswith("/chat/completions"):
            self._not_found("POST")
            return
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            self._send_json(400, {"error": {"message": "invalid JSON", "type": "invalid_request_error"}})
            return
        streaming = bool(body.get("stream"))
        llm = self.server.llm
        response = llm._record(body, scripted=streaming and llm.is_conversation(body, wire))
        try:
            if isinstance(response, ErrorResponse):
                self._send_json(
                    response.status, {"error": {"message": response.message, "type": "server_error"}}
                )
            elif wire != "chat":
                self._answer_in(wire, response, streaming)
            elif streaming:
                self._stream(response)
            else:
                self._complete(response)
        except (TimeoutError, BrokenPipeError, ConnectionResetError, _Disconnected):
            self.close_connection = True

    def _answer_in(self, wire: str, response: TextResponse | ToolCallResponse, streaming: bool) -> None:
        if not streaming and wire == "messages":
            tool_ids = [f"toolu_{self.next_id()}" for _ in getattr(response, "calls", ())]
            answer = scripted_messages.message(self.model, response, f"msg_{self.next_id()}", tool_ids)
            self._send_json(200, answer)
            return
        self._open_stream()
        (scripted_responses if wire == "responses" else scripted_messages).stream(self, response)

    # The Stream protocol of scripted_responses: what a wire format writes with.
    @property
    def model(self) -> str:
        return self.server.llm.model

    def event(self, name: str, payload: Mapping[str, Any]) -> None:
        if self.server.llm._stopped.is_set():
            raise _Disconnected
        data = json.dumps({"type": name, **payload})
        self.wfile.write(f"event: {name}\ndata: {data}\n\n".encode())
        self.wfile.flush()

    def pause(self, seconds: float) -> None:
        self._pause(seconds)

    def wait_gate(self, gate: threading.Event) -> None:
        self.server.llm._wait_gate(gate)

    def next_id(self) -> int:
        return self.server.llm._next_id()

    def _not_found(self, method: str) -> None:
        self.server.llm._record_other(method, self.path)
        self._send_json(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

    # -- answers -------------------------------------------------------------------------------

    def _send_json(self, status: int, payload: Mapping[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _complete(self, response: TextResponse | ToolCallResponse) -> None:
        llm = self.server.llm
        message: dict[str, Any] = {"role": "assistant", "content": None}
        finish = "stop"
        if isinstance(response, TextResponse):
            message["content"] = response.text
            if response.reasoning:
                message["reasoning_content"] = response.reasoning
        else:
            message["content"] = response.text or None
            message["tool_calls"] = [
                {
                    "id": call.call_id or f"call_{llm._next_id()}",
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments_json()},
                }
                for call in response.calls
            ]
            finish = "tool_calls"
        self._send_json(
            200,
            {
                "id": f"chatcmpl-{llm._next_id()}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": llm.model,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": _USAGE,
            },
        )

    def _stream(self, response: TextResponse | ToolCallResponse) -> None:
        llm = self.server.llm
        completion_id = f"chatcmpl-{llm._next_id()}"
        created = int(time.time())
        self._open_stream()

        def send(delta: dict[str, Any], finish: str | None = None, usage: bool = False) -> None:
            chunk: dict[str, Any] = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": llm.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            if usage:
                chunk["usage"] = _USAGE
            self._write_event(json.dumps(chunk))

        send({"role": "assistant", "content": ""})
        if isinstance(response, TextResponse):
            if response.reasoning:
                for piece in _split(response.reasoning, response.chunks):
                    send({"reasoning_content": piece})
                    self._pause(response.chunk_delay)
            for index, piece in enumerate(_split(response.text, response.chunks)):
                if index:
                    self._pause(response.chunk_delay)
                send({"content": piece})
                if index == 0 and response.gate is not None:
                    llm._wait_gate(response.gate)
            send({}, finish="stop", usage=True)
        else:
            if response.reasoning:
                send({"reasoning_content": response.reasoning})
            if response.text:
                send({"content": response.text})
            for index, call in enumerate(response.calls):
                send(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": call.call_id or f"call_{llm._next_id()}",
                                "type": "function",
                                "function": {"name": call.name, "arguments": ""},
                            }
                        ]
                    }
                )
                send({"tool_calls": [{"index": index, "function": {"arguments": call.arguments_json()}}]})
            send({}, finish="tool_calls", usage=True)
        self._write_event("[DONE]")

    def _open_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        # No length and no chunked encoding: the body ends when the connection closes.
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def _write_event(self, data: str) -> None:
        if self.server.llm._stopped.is_set():
            raise _Disconnected
        self.wfile.write(f"data: {data}\n\n".encode())
        self.wfile.flush()

    def _pause(self, seconds: float) -> None:
        # Waiting on the stop event keeps stop() prompt even in the middle of a slow stream.
        if seconds > 0 and self.server.llm._stopped.wait(seconds):
            raise _Disconnected


_USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def iter_requests_containing(llm: ScriptedLLM, needle: str) -> Iterator[dict[str, Any]]:
    """Yield recorded request bodies whose flattened text contains ``needle``."""
    return (body for body in llm.requests if needle in request_text(body))


__all__: Sequence[str] = (
    "DEFAULT_TEXT",
    "SIDE_CALL_TEXT",
    "ErrorResponse",
    "Response",
    "ScriptedLLM",
    "TextResponse",
    "ToolCall",
    "ToolCallResponse",
    "iter_requests_containing",
    "reasoning",
    "request_text",
    "text",
    "tool_call",
)
