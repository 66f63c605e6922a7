"""Session import without an agent: splitting a replayed history, writing it once, claiming jobs."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections
from django.utils import timezone

from projects.models import Session
from runs.discovery import claim_job, imported_turn_events, reap_orphaned_jobs, write_import
from runs.models import AgentJob, AgentJobKind, AgentJobState, Run, RunSource
from runs.runner.agents import AgentProcess
from runs.runner.jobs import JobLoop, imported_history, split_history
from runs.transcript import materialize
from tests import factories
from tests.support.runs import assert_journal_well_formed


def user_chunk(text: str, message_id: str | None = None) -> dict[str, Any]:
    update: dict[str, Any] = {
        "sessionUpdate": "user_message_chunk",
        "content": {"type": "text", "text": text},
    }
    if message_id:
        update["messageId"] = message_id
    return update


def agent_chunk(text: str, message_id: str = "a1") -> dict[str, Any]:
    return {
        "sessionUpdate": "agent_message_chunk",
        "content": {"type": "text", "text": text},
        "messageId": message_id,
    }


HISTORY = [
    user_chunk("Fix the ", "u1"),
    user_chunk("parser", "u1"),
    {"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "Reading it."}},
    agent_chunk("It is ", "a1"),
    agent_chunk("fixed.", "a1"),
    user_chunk("Now run ls", "u2"),
    {
        "sessionUpdate": "tool_call",
        "toolCallId": "t1",
        "title": "ls",
        "kind": "execute",
        "status": "in_progress",
    },
    {"sessionUpdate": "tool_call_update", "toolCallId": "t1", "status": "completed"},
    agent_chunk("Listed.", "a2"),
    {
        "sessionUpdate": "available_commands_update",
        "availableCommands": [{"name": "help", "description": "?"}],
    },
    {"sessionUpdate": "session_info_update", "title": "Parser work"},
]


def test_a_history_splits_into_one_turn_per_user_message() -> None:
    split = split_history(HISTORY)
    assert [t.prompt for t in split.turns] == ["Fix the parser", "Now run ls"]
    assert [len(t.updates) for t in split.turns] == [3, 3]
    assert split.title == "Parser work"
    assert split.commands == [{"name": "help", "description": "?", "input_hint": None}]


def test_consecutive_user_chunks_without_ids_are_one_prompt_but_new_ids_start_turns() -> None:
    split = split_history([user_chunk("a"), user_chunk("b"), user_chunk("c", "x"), user_chunk("d", "y")])
    assert [t.prompt for t in split.turns] == ["ab", "c", "d"]


def test_agent_output_before_any_user_message_is_kept_as_a_turn_without_prompt() -> None:
    split = split_history([agent_chunk("Welcome."), user_chunk("hi")])
    assert [(t.prompt, len(t.updates)) for t in split.turns] == [("", 1), ("hi", 0)]


def test_an_imported_turn_merges_deltas_and_ends_completed() -> None:
    turn = imported_history(split_history(HISTORY)).turns[0]
    events = imported_turn_events(turn, {"source": "import"})
    assert [e.type for e in events] == [
        "run.started",
        "reasoning.delta",
        "reasoning.done",
        "token.delta",
        "done",
    ]
    assert events[3].payload["delta"] == "It is fixed."
    assert events[-1].payload == {"state": "completed", "imported": True}


@pytest.mark.django_db
def test_write_import_creates_completed_turns_once(project: Any) -> None:
    session, created = write_import(project.pk, "agent-s1", imported_history(split_history(HISTORY)), "demo")
    again, created_again = write_import(
        project.pk, "agent-s1", imported_history(split_history(HISTORY)), "demo"
    )
    assert (created, created_again) == (True, False) and again.pk == session.pk
    assert session.title == "Parser work" and session.agent_session_id == "agent-s1"
    runs = list(Run.objects.filter(session=session).order_by("created_at", "id"))
    assert [(r.prompt_text, r.source, r.status) for r in runs] == [
        ("Fix the parser", RunSource.IMPORT, "completed"),
        ("Now run ls", RunSource.IMPORT, "completed"),
    ]
    for run in runs:
        assert_journal_well_formed(run)
    second = materialize(runs[1].events.order_by("seq"))
    assert second["text"] == "Listed." and second["tools"]["t1"]["status"] == "completed"


@pytest.mark.django_db
def test_claim_takes_the_oldest_pending_job_once(project: Any) -> None:
    first = AgentJob.objects.create(project=project, kind=AgentJobKind.LIST_SESSIONS)
    second = AgentJob.objects.create(project=project, kind=AgentJobKind.LIST_SESSIONS)
    assert claim_job("r1") == first.pk
    assert claim_job("r2") == second.pk
    assert claim_job("r3") is None
    first.refresh_from_db()
    assert first.state == AgentJobState.RUNNING and first.runner_id == "r1" and first.started_at


@pytest.mark.django_db
def test_a_job_whose_runner_stopped_heartbeating_is_failed_and_others_are_left_alone(project: Any) -> None:
    factories.RunnerFactory(id="alive")
    factories.RunnerFactory(id="silent", heartbeat_at=timezone.now() - timedelta(minutes=5))
    kept = AgentJob.objects.create(
        project=project, kind=AgentJobKind.LIST_SESSIONS, state=AgentJobState.RUNNING, runner_id="alive"
    )
    lost = AgentJob.objects.create(
        project=project, kind=AgentJobKind.LIST_SESSIONS, state=AgentJobState.RUNNING, runner_id="silent"
    )
    assert reap_orphaned_jobs("reaper") == [lost.pk]
    lost.refresh_from_db()
    kept.refresh_from_db()
    assert (lost.state, lost.error_code) == (AgentJobState.FAILED, "runner_lost")
    assert kept.state == AgentJobState.RUNNING


# ---------------------------------------------------------------- the job loop against a scripted agent


class ScriptedConn:
    """Stands in for the SDK connection: load replays `history` through the process's router."""

    def __init__(self, process: AgentProcess, history: list[dict[str, Any]], pages: list[Any]) -> None:
        self.process, self.history, self.pages = process, history, pages
        self.cursors: list[str | None] = []

    async def load_session(self, cwd: str, session_id: str, mcp_servers: list[Any]) -> None:
        for update in self.history:
            self.process.route_update(session_id, update)

    async def list_sessions(self, cwd: str, cursor: str | None = None) -> Any:
        self.cursors.append(cursor)
        return self.pages[int(cursor or 0)]


class Pool:
    def __init__(self, process: AgentProcess) -> None:
        self.process = process

    async def acquire(self, spec: Any, project_id: int, cwd: str) -> AgentProcess:
        return self.process

    async def release(self, process: AgentProcess) -> None:
        pass


def scripted(
    project: Any, history: Sequence[dict[str, Any]] = (), pages: Sequence[Any] = ()
) -> tuple[JobLoop, AgentProcess]:
    process = AgentProcess(settings.HERMESWEB_AGENTS["demo"], project.pk, project.path)
    process.conn = ScriptedConn(process, list(history), list(pages))
    process.capabilities = {"load_session": True, "session_capabilities": {"list": {}}}
    runner = SimpleNamespace(pool=Pool(process), runner_id="r-test", poll=0.01, stopping=asyncio.Event())
    return JobLoop(runner), process  # type: ignore[arg-type]


def run_job(loop: JobLoop, project: Any, kind: str, **payload: Any) -> AgentJob:
    job = AgentJob.objects.create(project=project, kind=kind, payload=payload)
    assert claim_job("r-test") == job.pk

    async def scenario() -> None:
        try:
            await loop.execute(job.pk)
        finally:
            # sync_to_async ran the queries in its own thread: close that thread's connection,
            # or PostgreSQL refuses to drop the test database.
            await sync_to_async(connections.close_all)()

    asyncio.run(scenario())
    job.refresh_from_db()
    return job


@pytest.mark.django_db(transaction=True)
def test_an_import_keeps_the_replay_and_leaves_the_agent_session_loaded_in_that_process(project: Any) -> None:
    loop, process = scripted(project, history=HISTORY)
    job = run_job(loop, project, AgentJobKind.IMPORT_SESSION, agent_session_id="s-1")
    assert job.state == AgentJobState.DONE, job.error
    assert job.result["created"] is True and job.result["turns"] == 2
    # The next turn of this session prompts without a reload; no sink or loading mark is left behind.
    assert "s-1" in process.loaded and "s-1" not in process.sinks and not process.loading


@pytest.mark.django_db(transaction=True)
def test_an_import_of_a_session_that_replays_nothing_fails_without_creating_one(project: Any) -> None:
    loop, _ = scripted(project, history=[])
    job = run_job(loop, project, AgentJobKind.IMPORT_SESSION, agent_session_id="ghost")
    assert (job.state, job.error_code) == (AgentJobState.FAILED, "empty_history")
    assert not Session.objects.filter(agent_session_id="ghost").exists()


@pytest.mark.django_db(transaction=True)
def test_a_listing_follows_every_page_and_keeps_only_the_projects_directory(project: Any) -> None:
    def info(sid: str, cwd: str) -> Any:
        return SimpleNamespace(session_id=sid, cwd=cwd, title=sid.upper(), updated_at="2026-01-01T00:00:00Z")

    pages = [
        SimpleNamespace(sessions=[info("a", project.path), info("x", "/elsewhere")], next_cursor="1"),
        SimpleNamespace(sessions=[info("b", project.path), info("a", project.path)], next_cursor=None),
    ]
    loop, process = scripted(project, pages=pages)
    job = run_job(loop, project, AgentJobKind.LIST_SESSIONS)
    assert job.state == AgentJobState.DONE, job.error
    assert [s["agent_session_id"] for s in job.result["sessions"]] == ["a", "b"]
    assert job.result["truncated"] is False
    assert process.conn.cursors == [None, "1"]


@pytest.mark.django_db(transaction=True)
def test_an_agent_without_session_list_fails_the_listing_with_a_coded_error(project: Any) -> None:
    loop, process = scripted(project)
    process.capabilities = {"load_session": True, "session_capabilities": {}}
    job = run_job(loop, project, AgentJobKind.LIST_SESSIONS)
    assert (job.state, job.error_code) == (AgentJobState.FAILED, "list_unsupported")
