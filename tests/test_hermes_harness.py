"""The real Hermes Agent, driven through the ACP client SDK against a ScriptedLLM.

These tests prove the harness the rest of the suite relies on: that hermes-acp runs offline, that
the scripted model's answers come back as ACP updates, and which Hermes behaviours (permissions,
/steer, session/load) the workbench can build on. Observations are recorded in docs/hermes-harness.md.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import acp
import pytest
from acp import text_block
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    DeniedOutcome,
    Implementation,
    PermissionOption,
    PromptResponse,
    RequestPermissionResponse,
    ToolCallUpdate,
)

from tests.support.hermes import AgentConfig, spawn_kwargs
from tests.support.scripted_llm import (
    DEFAULT_TEXT,
    SIDE_CALL_TEXT,
    ScriptedLLM,
    reasoning,
    request_text,
    text,
    tool_call,
)

# Harmless if the root conftest registers it too: pytest loads a plugin module once.
pytest_plugins = ["tests.support.hermes_fixtures"]

# Cold start to first answer is ~1.5 s; the margin absorbs a loaded CI machine.
STEP_TIMEOUT = 60.0


def run[T](coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class RecordingClient:
    """An ACP client that records every update and answers permission requests from a policy."""

    def __init__(self, permission_answer: str | None = "deny") -> None:
        # None answers "cancelled"; otherwise the option id to select.
        self.permission_answer = permission_answer
        self.updates: list[dict[str, Any]] = []
        self.permission_requests: list[tuple[dict[str, Any], list[PermissionOption]]] = []
        self._changed = asyncio.Condition()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        async with self._changed:
            self.updates.append(update.model_dump(mode="json", by_alias=True, exclude_none=True))
            self._changed.notify_all()

    async def request_permission(
        self, options: list[PermissionOption], session_id: str, tool_call: ToolCallUpdate, **kwargs: Any
    ) -> RequestPermissionResponse:
        async with self._changed:
            self.permission_requests.append(
                (tool_call.model_dump(mode="json", by_alias=True, exclude_none=True), options)
            )
            self._changed.notify_all()
        if self.permission_answer is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(
            outcome=AllowedOutcome(outcome="selected", option_id=self.permission_answer)
        )

    def on_connect(self, conn: Any) -> None:
        pass

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = STEP_TIMEOUT) -> None:
        async with asyncio.timeout(timeout):
            async with self._changed:
                await self._changed.wait_for(predicate)

    def kinds(self) -> list[str]:
        return [update["sessionUpdate"] for update in self.updates]

    def text_of(self, kind: str) -> str:
        return "".join(
            update["content"].get("text", "")
            for update in self.updates
            if update["sessionUpdate"] == kind and isinstance(update.get("content"), dict)
        )


@asynccontextmanager
async def hermes(
    config: AgentConfig, client: RecordingClient, cwd: Path, stderr_path: Path
) -> AsyncIterator[acp.ClientSideConnection]:
    """A hermes-acp process, initialized; its stderr is kept in ``stderr_path`` for post-mortems."""
    with stderr_path.open("ab") as stderr:
        async with acp.spawn_agent_process(
            client, config["command"], *config["args"], cwd=cwd, **spawn_kwargs(config, stderr)
        ) as (conn, _process):
            async with asyncio.timeout(STEP_TIMEOUT):
                init = await conn.initialize(
                    protocol_version=acp.PROTOCOL_VERSION,
                    client_capabilities=ClientCapabilities(),
                    client_info=Implementation(name="hermesweb-tests", version="0"),
                )
            assert init.agent_capabilities is not None and init.agent_capabilities.load_session
            yield conn


async def prompt(conn: acp.ClientSideConnection, session_id: str, message: str) -> PromptResponse:
    async with asyncio.timeout(STEP_TIMEOUT):
        return await conn.prompt(session_id=session_id, prompt=[text_block(message)])


def stderr_tail(path: Path) -> str:
    return path.read_text(errors="replace")[-4000:] if path.exists() else "(no stderr)"


def test_streamed_text_answer(
    hermes_agent_config: AgentConfig, scripted_llm: ScriptedLLM, hermes_workspace: Path, tmp_path: Path
) -> None:
    answer = "The quick brown fox jumps over the lazy dog."
    scripted_llm.enqueue(reasoning("Let me think about foxes.", answer, chunks=4, chunk_delay=0.02))
    client = RecordingClient()
    stderr_path = tmp_path / "hermes.stderr"

    async def scenario() -> PromptResponse:
        async with hermes(hermes_agent_config, client, hermes_workspace, stderr_path) as conn:
            session = await conn.new_session(cwd=str(hermes_workspace), mcp_servers=[])
            return await prompt(conn, session.session_id, "Tell me about foxes")

    result = run(scenario())

    assert result.stop_reason == "end_turn", stderr_tail(stderr_path)
    message_chunks = [u for u in client.updates if u["sessionUpdate"] == "agent_message_chunk"]
    assert len(message_chunks) > 1, client.kinds()
    assert client.text_of("agent_message_chunk").strip() == answer
    assert "foxes" in client.text_of("agent_thought_chunk")
    first = scripted_llm.scripted_requests[0]
    assert first["stream"] is True
    assert "Tell me about foxes" in request_text(first)


def _permission_scenario(
    config: AgentConfig, llm: ScriptedLLM, workspace: Path, stderr_path: Path, answer: str
) -> tuple[RecordingClient, PromptResponse]:
    (workspace / "doomed").mkdir()
    (workspace / "doomed" / "keep.txt").write_text("precious\n")
    # `rm -r`/`rm -rf` matches Hermes' "recursive delete" pattern; a plain `rm file` does not.
    llm.enqueue(tool_call("terminal", {"command": "rm -rf doomed"}), text("Finished."))
    client = RecordingClient(permission_answer=answer)

    async def scenario() -> PromptResponse:
        async with hermes(config, client, workspace, stderr_path) as conn:
            session = await conn.new_session(cwd=str(workspace), mcp_servers=[])
            return await prompt(conn, session.session_id, "Clean up the doomed directory")

    return client, run(scenario())


def _assert_documented_permission_request(client: RecordingClient) -> dict[str, Any]:
    assert len(client.permission_requests) == 1, client.kinds()
    tool_call_update, options = client.permission_requests[0]
    assert [(o.option_id, o.kind, o.name) for o in options] == [
        ("allow_once", "allow_once", "Allow once"),
        ("allow_session", "allow_always", "Allow for session"),
        ("allow_always", "allow_always", "Allow always"),
        ("deny", "reject_once", "Deny"),
        ("deny_always", "reject_always", "Deny always"),
    ]
    assert tool_call_update["toolCallId"].startswith("perm-check-")
    assert tool_call_update["rawInput"] == {"command": "rm -rf doomed", "description": "recursive delete"}
    live_ids = {u["toolCallId"] for u in client.updates if u["sessionUpdate"] == "tool_call"}
    assert live_ids and tool_call_update["toolCallId"] not in live_ids
    return tool_call_update


def test_dangerous_command_allowed_runs(
    hermes_agent_config: AgentConfig, scripted_llm: ScriptedLLM, hermes_workspace: Path, tmp_path: Path
) -> None:
    stderr_path = tmp_path / "hermes.stderr"
    client, result = _permission_scenario(
        hermes_agent_config, scripted_llm, hermes_workspace, stderr_path, "allow_once"
    )

    assert result.stop_reason == "end_turn", stderr_tail(stderr_path)
    _assert_documented_permission_request(client)
    assert not (hermes_workspace / "doomed").exists()
    tool_result = request_text(scripted_llm.scripted_requests[1])
    assert "approved by the user" in tool_result


def test_dangerous_command_denied_does_not_run(
    hermes_agent_config: AgentConfig, scripted_llm: ScriptedLLM, hermes_workspace: Path, tmp_path: Path
) -> None:
    stderr_path = tmp_path / "hermes.stderr"
    client, result = _permission_scenario(
        hermes_agent_config, scripted_llm, hermes_workspace, stderr_path, "deny"
    )

    assert result.stop_reason == "end_turn", stderr_tail(stderr_path)
    _assert_documented_permission_request(client)
    assert (hermes_workspace / "doomed" / "keep.txt").read_text() == "precious\n"
    second = scripted_llm.scripted_requests[1]
    tool_messages = [m for m in second["messages"] if m.get("role") == "tool"]
    assert tool_messages and json.loads(tool_messages[-1]["content"])["status"] == "blocked"


def test_steer_reaches_the_model_with_the_next_tool_result(
    hermes_agent_config: AgentConfig, scripted_llm: ScriptedLLM, hermes_workspace: Path, tmp_path: Path
) -> None:
    steer = "STEER-7f3a: prefer tabs over spaces"
    # The tool blocks until the test creates `release`, so /steer provably lands mid-tool-loop.
    command = "while [ ! -e release ]; do sleep 0.05; done; echo released"
    scripted_llm.enqueue(tool_call("terminal", {"command": command}), text("Steered and done."))
    client = RecordingClient()
    stderr_path = tmp_path / "hermes.stderr"

    async def scenario() -> tuple[PromptResponse, PromptResponse]:
        async with hermes(hermes_agent_config, client, hermes_workspace, stderr_path) as conn:
            session = await conn.new_session(cwd=str(hermes_workspace), mcp_servers=[])
            turn = asyncio.create_task(prompt(conn, session.session_id, "Format the code"))
            try:
                await client.wait_for(lambda: "tool_call" in client.kinds())
                steered = await prompt(conn, session.session_id, f"/steer {steer}")
            finally:
                # Even on failure: never leave the shell loop running after Hermes exits.
                (hermes_workspace / "release").touch()
            return await turn, steered

    turn_result, steer_result = run(scenario())

    assert steer_result.stop_reason == "end_turn", stderr_tail(stderr_path)
    assert "Steer queued" in client.text_of("agent_message_chunk")
    assert turn_result.stop_reason == "end_turn", stderr_tail(stderr_path)
    first, second = scripted_llm.wait_for_requests(2, scripted_only=True)[:2]
    assert steer not in request_text(first)
    # Hermes appends the steer to the last tool result rather than adding a user message.
    tool_messages = [m for m in second["messages"] if m.get("role") == "tool"]
    assert tool_messages and steer in str(tool_messages[-1]["content"])
    assert "released" in str(tool_messages[-1]["content"])


def test_session_load_in_fresh_process_replays_and_keeps_context(
    hermes_agent_config: AgentConfig, scripted_llm: ScriptedLLM, hermes_workspace: Path, tmp_path: Path
) -> None:
    codeword = "PAPAYA-4242"
    scripted_llm.enqueue(f"Noted, the codeword is {codeword}.", "You told me the codeword earlier.")
    stderr_path = tmp_path / "hermes.stderr"

    async def first_process() -> str:
        client = RecordingClient()
        async with hermes(hermes_agent_config, client, hermes_workspace, stderr_path) as conn:
            session = await conn.new_session(cwd=str(hermes_workspace), mcp_servers=[])
            result = await prompt(conn, session.session_id, f"Remember the codeword {codeword}")
            assert result.stop_reason == "end_turn", stderr_tail(stderr_path)
            return session.session_id

    session_id = run(first_process())
    replay_client = RecordingClient()

    async def second_process() -> PromptResponse:
        async with hermes(hermes_agent_config, replay_client, hermes_workspace, stderr_path) as conn:
            async with asyncio.timeout(STEP_TIMEOUT):
                await conn.load_session(cwd=str(hermes_workspace), session_id=session_id, mcp_servers=[])
            # session/load replays history before it answers: no waiting needed here.
            assert f"Remember the codeword {codeword}" in replay_client.text_of("user_message_chunk")
            assert f"Noted, the codeword is {codeword}." in replay_client.text_of("agent_message_chunk")
            return await prompt(conn, session_id, "What was the codeword?")

    result = run(second_process())

    assert result.stop_reason == "end_turn", stderr_tail(stderr_path)
    follow_up = scripted_llm.scripted_requests[-1]
    follow_up_text = request_text(follow_up)
    assert "What was the codeword?" in follow_up_text
    assert f"Remember the codeword {codeword}" in follow_up_text
    assert f"Noted, the codeword is {codeword}." in follow_up_text


def _post(llm: ScriptedLLM, body: dict[str, Any]) -> bytes:
    request = urllib.request.Request(
        f"{llm.base_url}/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read()


def _sse_deltas(raw: bytes) -> tuple[list[dict[str, Any]], list[str | None]]:
    events = [line[len(b"data: ") :].decode() for line in raw.splitlines() if line.startswith(b"data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    return [c["choices"][0]["delta"] for c in chunks], [c["choices"][0]["finish_reason"] for c in chunks]


def test_scripted_llm_speaks_openai_wire_format(scripted_llm: ScriptedLLM) -> None:
    """The server alone, without Hermes: fast feedback when the wire format breaks."""
    scripted_llm.enqueue(
        reasoning("hmm", "abcdef", chunks=3), tool_call("terminal", {"command": "ls"}, call_id="call_x")
    )
    chat = {"model": "mock-model", "messages": [{"role": "user", "content": "hi"}]}

    deltas, finishes = _sse_deltas(_post(scripted_llm, {**chat, "stream": True}))
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "hmm"
    assert [d["content"] for d in deltas if d.get("content")] == ["ab", "cd", "ef"]
    assert finishes[-1] == "stop"

    # A side call (title) gets the fixed answer and leaves the script alone.
    side = json.loads(_post(scripted_llm, chat))
    assert side["choices"][0]["message"]["content"] == SIDE_CALL_TEXT
    assert scripted_llm.pending == 1

    deltas, finishes = _sse_deltas(_post(scripted_llm, {**chat, "stream": True}))
    calls = [call for d in deltas for call in d.get("tool_calls", [])]
    assert calls[0]["id"] == "call_x" and calls[0]["function"]["name"] == "terminal"
    assert json.loads("".join(c["function"].get("arguments", "") for c in calls)) == {"command": "ls"}
    assert finishes[-1] == "tool_calls"

    deltas, _ = _sse_deltas(_post(scripted_llm, {**chat, "stream": True}))
    assert "".join(d.get("content", "") for d in deltas) == DEFAULT_TEXT

    assert len(scripted_llm.wait_for_requests(4, timeout=1)) == 4
    assert len(scripted_llm.scripted_requests) == 3
    with pytest.raises(TimeoutError):
        scripted_llm.wait_for_requests(5, timeout=0.05)
    with urllib.request.urlopen(f"{scripted_llm.base_url}/models", timeout=10) as response:
        assert json.load(response)["data"][0]["id"] == "mock-model"


def test_a_reply_to_a_prompt_goes_to_the_request_holding_it_whatever_came_first(
    scripted_llm: ScriptedLLM,
) -> None:
    """A late request of another turn (a jammed agent's) takes the script; the prompt's its reply."""
    scripted_llm.reply_to("carry on", "For the new turn.")
    scripted_llm.enqueue("Scripted.")
    late = {"model": "mock-model", "stream": True, "messages": [{"role": "user", "content": "old turn"}]}
    new = {**late, "messages": [{"role": "user", "content": "Never mind, carry on"}]}

    deltas, _ = _sse_deltas(_post(scripted_llm, late))
    assert "".join(d.get("content", "") for d in deltas) == "Scripted."
    deltas, _ = _sse_deltas(_post(scripted_llm, new))
    assert "".join(d.get("content", "") for d in deltas) == "For the new turn."
    deltas, _ = _sse_deltas(_post(scripted_llm, new))  # once only
    assert "".join(d.get("content", "") for d in deltas) == DEFAULT_TEXT
