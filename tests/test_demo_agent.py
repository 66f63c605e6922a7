"""The bundled demo ACP agent, driven as a real subprocess over stdio by the official SDK client."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from acp import RequestError, text_block
from acp.schema import (
    DeclineElicitationResponse,
    ElicitationFormSessionMode,
    PromptResponse,
)

from runs.demo_agent.scripts import HOLD_MAX_SECONDS_ENV, HOLD_RELEASE_FILE
from tests.support.acp_client import AgentHandle, RecordingClient, default_capabilities, demo_agent

STEER_ACK = "Steer queued for the active turn"
TEST_TIMEOUT_S = 20.0


def run(body: Callable[[], Awaitable[None]]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(TEST_TIMEOUT_S):
            await body()

    asyncio.run(bounded())


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "agent-home"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


async def new_session(agent: AgentHandle, cwd: Path) -> str:
    response = await agent.conn.new_session(cwd=str(cwd), mcp_servers=[])
    return response.session_id


async def ask(agent: AgentHandle, session_id: str, text: str) -> PromptResponse:
    return await agent.conn.prompt(session_id=session_id, prompt=[text_block(text)])


def is_kind(kind: str) -> Callable[[Any], bool]:
    return lambda update: update.session_update == kind


# ------------------------------------------------------------------ handshake and session setup


def test_initialize_advertises_load_list_images_embedded_files_and_slash_steer(home: Path) -> None:
    async def body() -> None:
        async with demo_agent(home) as agent:
            init = agent.init
            assert init.agent_info is not None and init.agent_info.name == "hermesweb-demo"
            caps = init.agent_capabilities
            assert caps is not None and caps.load_session is True
            assert caps.session_capabilities is not None
            assert caps.session_capabilities.list is not None
            assert caps.session_capabilities.resume is not None
            prompts = caps.prompt_capabilities
            assert prompts is not None and (prompts.image, prompts.embedded_context, prompts.audio) == (
                True,
                True,
                False,
            )
            assert init.field_meta == {"steer": "slash"}

    run(body)


def test_the_reference_states_the_prompt_capabilities_the_agent_advertises(home: Path) -> None:
    reference = (Path(__file__).resolve().parent.parent / "docs" / "demo-agent.md").read_text()
    stated = re.search(
        r"promptCapabilities: \{image: (\w+), audio: (\w+),\s+embeddedContext: (\w+)\}", reference
    )
    assert stated is not None, "docs/demo-agent.md no longer states promptCapabilities"
    advertised: list[Any] = []

    async def body() -> None:
        async with demo_agent(home) as agent:
            caps = agent.init.agent_capabilities
            assert caps is not None and caps.prompt_capabilities is not None
            prompts = caps.prompt_capabilities
            advertised.extend([prompts.image, prompts.audio, prompts.embedded_context])

    run(body)
    assert [word == "true" for word in stated.groups()] == advertised


def test_new_session_advertises_help_steer_and_title_commands(home: Path, workdir: Path) -> None:
    async def body() -> None:
        async with demo_agent(home) as agent:
            session_id = await new_session(agent, workdir)
            update = await agent.client.wait_for(is_kind("available_commands_update"))
            commands = {command.name: command for command in update.available_commands}
            assert list(commands) == ["help", "steer", "title"]
            steer_input = commands["steer"].input
            assert steer_input is not None and steer_input.root.hint == "guidance"

            response = await ask(agent, session_id, "/help")
            assert response.stop_reason == "end_turn"
            help_text = agent.client.text(session_id=session_id)
            assert "/steer" in help_text and "/title" in help_text and "toolloop" in help_text

    run(body)


def test_first_turn_sends_title_from_prompt_and_later_turns_do_not(home: Path, workdir: Path) -> None:
    async def body() -> None:
        async with demo_agent(home) as agent:
            session_id = await new_session(agent, workdir)
            await ask(agent, session_id, "fast refactor the billing module, please, carefully and quickly")
            titles = agent.client.of_kind("session_info_update", session_id)
            assert [t.title for t in titles] == ["Fast refactor the billing module please"]
            assert titles[0].updated_at

            await ask(agent, session_id, "fast another question entirely")
            assert len(agent.client.of_kind("session_info_update", session_id)) == 1

            await ask(agent, session_id, "/title Billing cleanup")
            assert agent.client.of_kind("session_info_update", session_id)[-1].title == "Billing cleanup"

    run(body)


# --------------------------------------------------------------------------------- scripts


def test_default_prompt_streams_markdown_in_small_chunks_and_ends_turn(home: Path, workdir: Path) -> None:
    async def body() -> None:
        async with demo_agent(home) as agent:
            session_id = await new_session(agent, workdir)
            response = await ask(agent, session_id, "Explain the widget pipeline")
            assert response.stop_reason == "end_turn"

            chunks = agent.client.of_kind("agent_message_chunk", session_id)
            assert len(chunks) > 10
            assert max(len(chunk.content.text.split()) for chunk in chunks) <= 6
            text = agent.client.text(session_id=session_id)
            assert text.startswith("## ")
            assert "> Explain the widget pipeline" in text
            assert "\n- " in text
            assert "```python\n" in text and text.count("```") == 2

    run(body)


def test_every_turn_reports_deterministic_usage_and_a_growing_context_gauge(
    home: Path, workdir: Path
) -> None:
    async def body() -> None:
        async with demo_agent(home) as agent:
            session_id = await new_session(agent, workdir)
            first = await ask(agent, session_id, "fast four words right here")
            second = await ask(agent, session_id, "fast four words right here")
            assert first.usage is not None and second.usage is not None
            # 5 prompt words -> ceil(5 * 4 / 3) tokens.
            assert first.usage.input_tokens == 7
            assert first.usage.output_tokens > 0
            assert first.usage.total_tokens == first.usage.input_tokens + first.usage.output_tokens
            assert first.usage == second.usage

            gauges = agent.client.of_kind("usage_update", session_id)
            assert len(gauges) == 2
            assert gauges[0].size == gauges[1].size > gauges[1].used
            assert gauges[1].used - gauges[0].used == second.usage.total_tokens

    run(body)


def test_think_emits_several_thought_chunks_before_any_text(home: Path, workdir: Path) -> None:
    async def body() -> None:
        async with demo_agent(home) as agent:
            session_id = await new_session(agent, workdir)
            response = await ask(agent, session_id, "Think about the cache layer")
            assert response.stop_reason == "end_turn"
            kinds = [k for k in agent.client.kinds(session_id) if k.startswith("agent_")]
            assert kinds.count("agent_thought_chunk") >= 3
            assert kinds.count("agent_message_chunk") >= 1
            assert kinds.index("agent_message_chunk") > max(
                i for i, k in enumerate(kinds) if k == "agent_thought_chunk"
            )
            assert response.usage is not None and (response.usage.thought_tokens or 0) > 0

    run(body)


def test_tool_emits_execute_call_then_output_then_completed_update(home: Path, workdir: Path) -> None:
    async def body() -> None:
        (workdir / "README.md").write_text("hi")
        async with demo_agent(home) as agent:
            session_id = await new_session(agent, workdir)
            response = await ask(agent, session_id, "fast run a tool")
            assert response.stop_reason == "end_turn"

            starts = agent.client.of_kind("tool_call", session_id)
            assert len(starts) == 1
            start = starts[0]
            assert (start.kind, start.status, start.raw_input) == (
                "execute",
                "in_progress",
                {"command": "ls"},
            )
            updates = agent.client.of_kind("tool_call_update", session_id)
            assert all(u.tool_call_id == start.tool_call_id for u in updates)
            outputs = [u for u in updates if u.content]
            assert outputs and outputs[0].content[0].content.text == "README.md"
            assert updates[-1].status == "completed"
            kinds = agent.client.kinds(session_id)
            assert kinds.index("tool_call") < len(kinds) - 1 - kinds[::-1].index("agent_message_chunk")

    run(body)


def test_plan_updates_three_entries_from_pending_to_completed_between_text(home: Path, workdir: Path) -> None:
    async def body() -> None:
        async with demo_agent(home) as agent:
            session_id = await new_session(agent, workdir)
            await ask(agent, session_id, "fast plan the release")
            plans = agent.client.of_kind("plan", session_id)
            assert all(len(p.entries) == 3 for p in plans)
            assert [e.status for e in plans[0].entries] == ["pending"] * 3
            assert [e.status for e in plans[-1].entries] == ["completed"] * 3
            first_entry = [p.entries[0].status for p in plans]
            assert first_entry.index("in_progress") < first_entry.index("completed")
            kinds = agent.client.kinds(session_id)
            plan_positions = [i for i, k in enumerate(kinds) if k == "plan"]
            between = kinds[plan_positions[0] : plan_positions[-1]]
            assert "agent_message_chunk" in between

    run(body)


# -------------------------------------------------------------------------------- permissions


def test_approve_allowed_writes_approved_txt_in_the_session_cwd(home: Path, workdir: Path) -> None:
    async def body() -> None:
        async with demo_agent(home, client=RecordingClient(permission_answer="allow_once")) as agent:
            session_id = await new_session(agent, workdir)
            response = await ask(agent, session_id, "fast approve this")
            assert response.stop_reason == "end_turn"

            (request,) = agent.client.permissions
            assert [(o.option_id, o.name, o.kind) for o in request.options] == [
                ("allow_once", "Allow once", "allow_once"),
                ("allow_always", "Allow for session", "allow_always"),
                ("deny", "Deny", "reject_once"),
                ("deny_always", "Always deny", "reject_always"),
            ]
            (start,) = agent.client.of_kind("tool_call", session_id)
            assert request.tool_call.tool_call_id == start.tool_call_id
            assert start.title == "Write approved.txt"
            assert (workdir / "approved.txt").is_file()
            assert agent.client.of_kind("tool_call_update", session_id)[-1].status == "completed"
            assert "Approved: wrote approved.txt" in agent.client.text(session_id=session_id)

    run(body)


def test_approve_denied_writes_nothing_and_fails_the_tool(home: Path, workdir: Path) -> None:
    async def body() -> None:
        async with demo_agent(home, client=RecordingClient(permission_answer="deny")) as agent:
            session_id = await new_session(agent, workdir)
            response = await ask(agent, session_id, "fast permission please")
            assert response.stop_reason == "end_turn"
            assert len(agent.client.permissions) == 1
            assert list(workdir.iterdir()) == []
            assert agent.client.of_kind("tool_call_update", session_id)[-1].status == "failed"
            assert "Denied: nothing written" in agent.client.text(session_id=session_id)

    run(body)


def test_allow_for_session_is_remembered_for_later_writes(home: Path, workdir: Path) -> None:
    async def body() -> None:
        async with demo_agent(home, client=RecordingClient(permission_answer="allow_always")) as agent:
            session_id = await new_session(agent, workdir)
            await ask(agent, session_id, "fast approve")
            (workdir / "approved.txt").unlink()
            await ask(agent, session_id, "fast approve again")
            assert len(agent.client.permissions) == 1
            assert (workdir / "approved.txt").is_file()

    run(body)


def test_cancelled_permission_outcome_ends_the_turn_cancelled(home: Path, workdir: Path) -> None:
    async def body() -> None:
        async with demo_agent(home, client=RecordingClient(permission_answer="cancelled")) as agent:
            session_id = await new_session(agent, workdir)
            response = await ask(agent, session_id, "fast approve")
            assert response.stop_reason == "cancelled"
            assert list(workdir.iterdir()) == []
            assert agent.client.of_kind("tool_call_update", session_id)[-1].status == "failed"

    run(body)


def test_session_cancel_while_permission_is_pending_ends_the_turn_cancelled(
    home: Path, workdir: Path
) -> None:
    async def body() -> None:
        client = RecordingClient(permission_answer="allow_once", permission_gate=asyncio.Event())
        async with demo_agent(home, client=client) as agent:
            session_id = await new_session(agent, workdir)
            turn = asyncio.create_task(ask(agent, session_id, "fast approve"))
            await client.wait_until(lambda: bool(client.permissions))
            await agent.conn.cancel(session_id=session_id)
            response = await turn
            assert response.stop_reason == "cancelled"
            assert client.permission_gate is not None
            client.permission_gate.set()  # the late "allow" must not write anything now
            follow_up = await ask(agent, session_id, "fast hello")
            assert follow_up.stop_reason == "end_turn"
            assert not (workdir / "approved.txt").exists()

    run(body)


def test_edit_shows_a_diff_and_writes_only_when_allowed(home: Path, workdir: Path) -> None:
    async def body() -> None:
        client = RecordingClient(permission_answer="allow_once")
        async with demo_agent(home, client=client) as agent:
            session_id = await new_session(agent, workdir)
            target = workdir / "demo-edit.txt"
            await ask(agent, session_id, "fast edit the file")
            (start,) = agent.client.of_kind("tool_call", session_id)
            assert start.kind == "edit"
            (diff,) = start.content
            assert (diff.type, diff.path, diff.old_text) == ("diff", str(target), None)
            assert target.read_text() == diff.new_text

            client.permission_answer = "deny"
            before = target.read_text()
            await ask(agent, session_id, "fast edit it again")
            assert len(client.permissions) == 2
            assert target.read_text() == before
            assert agent.client.of_kind("tool_call_update", session_id)[-1].status == "failed"

    run(body)


# -------------------------------------------------------------------------------- elicitation


def test_ask_round_trips_an_elicitation_answer(home: Path, workdir: Path) -> None:
    async def body() -> None:
        client = RecordingClient()
        async with demo_agent(home, client=client) as agent:
            session_id = await new_session(agent, workdir)
            response = await ask(agent, session_id, "fast ask me something")
            assert response.stop_reason == "end_turn"
            (call,) = client.elicitations
            assert call.message == "Which colour should I use?"
            assert isinstance(call.mode, ElicitationFormSessionMode)
            assert call.mode.session_id == session_id
            schema = call.mode.requested_schema
            assert schema.required == ["answer"]
            assert schema.properties is not None and schema.properties["answer"].type == "string"
            assert "You answered: teal" in client.text(session_id=session_id)

            client.elicitation_answer = DeclineElicitationResponse(action="decline")
            mark = client.mark()
            await ask(agent, session_id, "fast clarify please")
            later = "".join(
                u.content.text for _, u in client.updates[mark:] if u.session_update == "agent_message_chunk"
            )
            assert "No answer given." in later

    run(body)


def test_ask_without_client_elicitation_support_says_so_and_ends_normally(home: Path, workdir: Path) -> None:
    async def body() -> None:
        async with demo_agent(home, capabilities=default_capabilities(elicitation=False)) as agent:
            session_id = await new_session(agent, workdir)
            response = await ask(agent, session_id, "fast ask")
            assert response.stop_reason == "end_turn"
            assert agent.client.elicitations == []
            assert "does not support" in agent.client.text(session_id=session_id)

    run(body)


# -------------------------------------------------------------------- cancel, steer, busy, crash


def test_cancel_during_slow_returns_cancelled_promptly_and_keeps_partial_text(
    home: Path, workdir: Path
) -> None:
    async def body() -> None:
        async with demo_agent(home) as agent:
            session_id = await new_session(agent, workdir)
            turn = asyncio.create_task(ask(agent, session_id, "slow"))
            await agent.client.wait_until(
                lambda: len(agent.client.of_kind("agent_message_chunk", session_id)) >= 3
            )
            started = time.monotonic()
            await agent.conn.cancel(session_id=session_id)
            response = await turn
            assert time.monotonic() - started < 2.0  # vs ~15 s uncancelled; slack for loaded CI
            assert response.stop_reason == "cancelled"
            partial = agent.client.text(session_id=session_id)
            assert "Slow chunk 1." in partial
            assert "Finished the slow run" not in partial

            # The session is not stuck "cancelling": the next prompt runs normally.
            assert (await ask(agent, session_id, "fast hello")).stop_reason == "end_turn"

    run(body)


def held_chunks(agent: AgentHandle, session_id: str) -> int:
    return agent.client.text(session_id=session_id).count("Held chunk ")


def test_hold_streams_until_the_release_file_appears_and_then_ends_normally(
    home: Path, workdir: Path
) -> None:
    async def body() -> None:
        async with demo_agent(home) as agent:
            session_id = await new_session(agent, workdir)
            turn = asyncio.create_task(ask(agent, session_id, "hold fast"))
            # Far past `slow`'s 300 chunks' worth at this delay: only the release can end it.
            await agent.client.wait_until(lambda: held_chunks(agent, session_id) >= 40)
            assert not turn.done()
            (workdir / HOLD_RELEASE_FILE).write_text("")
            response = await turn
            assert response.stop_reason == "end_turn"
            text = agent.client.text(session_id=session_id)
            numbers = [int(n) for n in re.findall(r"Held chunk (\d+)\. ", text)]
            assert numbers == list(range(1, len(numbers) + 1))
            assert text.endswith(f"Released after {len(numbers)} held chunks.")
            # The release is taken, so the next `hold` waits for a release of its own.
            assert not (workdir / HOLD_RELEASE_FILE).exists()

    run(body)


def test_hold_is_cancelled_promptly(home: Path, workdir: Path) -> None:
    async def body() -> None:
        async with demo_agent(home) as agent:
            session_id = await new_session(agent, workdir)
            turn = asyncio.create_task(ask(agent, session_id, "hold"))
            await agent.client.wait_until(lambda: held_chunks(agent, session_id) >= 3)
            started = time.monotonic()
            await agent.conn.cancel(session_id=session_id)
            response = await turn
            assert time.monotonic() - started < 2.0  # vs the 120 s bound; slack for loaded CI
            assert response.stop_reason == "cancelled"
            assert "Released" not in agent.client.text(session_id=session_id)
            assert (await ask(agent, session_id, "fast hello")).stop_reason == "end_turn"

    run(body)


def test_hold_never_released_ends_by_itself_at_its_bound(home: Path, workdir: Path) -> None:
    async def body() -> None:
        async with demo_agent(home, env={HOLD_MAX_SECONDS_ENV: "0.5"}) as agent:
            session_id = await new_session(agent, workdir)
            started = time.monotonic()
            response = await ask(agent, session_id, "hold")
            assert time.monotonic() - started >= 0.5
            assert response.stop_reason == "end_turn"
            text = agent.client.text(session_id=session_id)
            assert "Held chunk 1. " in text
            assert text.endswith("Not released within 0.5 s; finished by itself.")

    run(body)


def test_second_ordinary_prompt_during_a_turn_is_rejected_loudly(home: Path, workdir: Path) -> None:
    async def body() -> None:
        async with demo_agent(home) as agent:
            session_id = await new_session(agent, workdir)
            turn = asyncio.create_task(ask(agent, session_id, "slow"))
            await agent.client.wait_for(is_kind("agent_message_chunk"))
            with pytest.raises(RequestError):
                await ask(agent, session_id, "hello while busy")
            await agent.conn.cancel(session_id=session_id)
            assert (await turn).stop_reason == "cancelled"

    run(body)


def test_steer_during_toolloop_is_acknowledged_and_injected_into_the_running_turn(
    home: Path, workdir: Path
) -> None:
    async def body() -> None:
        async with demo_agent(home) as agent:
            client = agent.client
            session_id = await new_session(agent, workdir)
            turn = asyncio.create_task(ask(agent, session_id, "toolloop"))
            await client.wait_for(is_kind("tool_call"))

            ack = await ask(agent, session_id, "/steer prefer the left branch")
            assert ack.stop_reason == "end_turn"
            assert not turn.done()
            assert any(
                u.session_update == "agent_message_chunk" and u.content.text == STEER_ACK
                for _, u in client.updates
            )

            response = await turn
            assert response.stop_reason == "end_turn"
            updates = [u for _, u in client.updates]
            notice = "\n\n> Steer received: prefer the left branch\n\n"
            steer_at = next(
                i
                for i, u in enumerate(updates)
                if u.session_update == "agent_message_chunk" and u.content.text == notice
            )
            tool_calls_at = [i for i, u in enumerate(updates) if u.session_update == "tool_call"]
            assert tool_calls_at[0] < steer_at < tool_calls_at[-1]

    run(body)


def test_steer_on_an_idle_session_runs_its_text_as_a_prompt(home: Path, workdir: Path) -> None:
    async def body() -> None:
        async with demo_agent(home) as agent:
            session_id = await new_session(agent, workdir)
            response = await ask(agent, session_id, "/steer fast think about edge cases")
            assert response.stop_reason == "end_turn"
            assert agent.client.of_kind("agent_thought_chunk", session_id)
            assert STEER_ACK not in agent.client.text(session_id=session_id)

    run(body)


def test_crash_sends_some_text_then_kills_the_process(home: Path, workdir: Path) -> None:
    async def body() -> None:
        async with demo_agent(home) as agent:
            session_id = await new_session(agent, workdir)
            with pytest.raises(ConnectionError):
                await ask(agent, session_id, "crash")
            assert "Crashing now" in agent.client.text(session_id=session_id)
            assert await asyncio.wait_for(agent.process.wait(), 5) == 3

    run(body)


def test_unknown_session_ids_are_json_rpc_errors(home: Path, workdir: Path) -> None:
    async def body() -> None:
        async with demo_agent(home) as agent:
            with pytest.raises(RequestError):
                await ask(agent, "no-such-session", "hello")
            with pytest.raises(RequestError):
                await agent.conn.load_session(cwd=str(workdir), session_id="no-such-session", mcp_servers=[])

    run(body)


# --------------------------------------------------------------------------------- persistence


def test_load_in_a_fresh_process_replays_history_before_answering_and_list_filters_by_cwd(
    home: Path, tmp_path: Path
) -> None:
    cwd_a = tmp_path / "project-a"
    cwd_b = tmp_path / "project-b"
    cwd_a.mkdir()
    cwd_b.mkdir()

    async def body() -> None:
        async with demo_agent(home) as first:
            session_a = await new_session(first, cwd_a)
            await ask(first, session_a, "fast think about caching")
            await ask(first, session_a, "fast tool please")
            session_b = await new_session(first, cwd_b)
            await ask(first, session_b, "fast hello")
            live_text = first.client.text(session_id=session_a)
            live_thoughts = first.client.text("agent_thought_chunk", session_id=session_a)
            live_tool_ids = [u.tool_call_id for u in first.client.of_kind("tool_call", session_a)]
        assert first.process.returncode == 0

        async with demo_agent(home) as second:
            listed_a = (await second.conn.list_sessions(cwd=str(cwd_a))).sessions
            assert [(s.session_id, s.title) for s in listed_a] == [(session_a, "Fast think about caching")]
            assert listed_a[0].updated_at
            listed_b = (await second.conn.list_sessions(cwd=str(cwd_b))).sessions
            assert [s.session_id for s in listed_b] == [session_b]
            assert {s.session_id for s in (await second.conn.list_sessions()).sessions} == {
                session_a,
                session_b,
            }

            await second.conn.load_session(cwd=str(cwd_a), session_id=session_a, mcp_servers=[])
            client = second.client
            users = [u.content.text for u in client.of_kind("user_message_chunk", session_a)]
            assert users == ["fast think about caching", "fast tool please"]
            assert client.text(session_id=session_a) == live_text
            assert client.text("agent_thought_chunk", session_id=session_a) == live_thoughts
            assert [u.tool_call_id for u in client.of_kind("tool_call", session_a)] == live_tool_ids
            assert client.of_kind("tool_call_update", session_a)[-1].status == "completed"

            # On the wire, every replayed update precedes the session/load response.
            raw = client.raw_incoming
            load_answer = max(i for i, m in enumerate(raw) if "result" in m or "error" in m)
            replayed = [
                i
                for i, m in enumerate(raw)
                if m.get("method") == "session/update"
                and m["params"]["update"]["sessionUpdate"]
                in {"user_message_chunk", "agent_message_chunk", "agent_thought_chunk", "tool_call"}
            ]
            assert replayed and max(replayed) < load_answer

            # The loaded session keeps working in the new process.
            assert (await ask(second, session_a, "fast one more")).stop_reason == "end_turn"

    run(body)
