"""The user's channel: every socket of a user follows the live state of all their sessions.

A change in session B reaches a socket that watches session A: through the doorbell with
Redis (the repair poll is switched off here), through the embedded mode's bounded poll
without. Another user's sessions never appear. Design note: docs/live-delivery.md.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from websockets.sync.client import connect

from intents.models import PendingIntent
from runs import controls, services
from runs.agents import load_agents
from runs.live.user_states import changes, read_states
from runs.models import EventType, Run, RunStatus
from tests import factories
from tests.support.hermes import AgentConfig
from tests.support.live import LiveSocket, LiveStack, layer, live, session_cookie  # noqa: F401
from tests.support.scripted_llm import ScriptedLLM, text, tool_call

NEVER = "3600"  # seconds: a poll that never comes within a test


def sessions_frames(socket: LiveSocket) -> list[dict[str, Any]]:
    return [f for f in socket.frames if f["type"] == "sessions"]


def state_of(frame: dict[str, Any], session_id: int) -> dict[str, Any] | None:
    return next((s for s in frame["sessions"] if s["id"] == session_id), None)


def until_state(socket: LiveSocket, session_id: int, predicate: Any, timeout: float = 60) -> dict[str, Any]:
    def match(frame: dict[str, Any]) -> bool:
        state = state_of(frame, session_id) if frame["type"] == "sessions" else None
        return state is not None and predicate(state)

    return state_of(socket.until(match, timeout)[-1], session_id)  # type: ignore[return-value]


def wait_for_run(run_id: int, status: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while Run.objects.get(pk=run_id).status != status:
        assert time.monotonic() < deadline, f"run {run_id} never reached {status}"
        time.sleep(0.05)


def user_socket(live: LiveStack, cookie: str) -> LiveSocket:
    """A socket on /ws/live/: a page with no session open."""
    ws = connect(
        f"ws://127.0.0.1:{live.port}/ws/live/",
        origin=live.origin(),  # type: ignore[arg-type]
        additional_headers={"Cookie": f"sessionid={cookie}"},
        proxy=None,
        open_timeout=30,
    )
    return LiveSocket(live.sockets.enter_context(ws))


# ---------------------------------------------------------------- the rings


# Its reads go through channels' one database thread, which keeps the connection an earlier test
# opened there (SQLite's connections are kept): checking that connection needs the database.
@pytest.mark.django_db
def test_the_rings_of_a_turns_start_make_one_read(monkeypatch: pytest.MonkeyPatch) -> None:
    # The submit rings, and run.started rings a few ms later: one read of the states, after
    # both, rather than one beside the runner's claim and another beside the first token.
    from runs.live import user_feed

    reads: list[int] = []

    def counted(user_id: Any) -> dict[int, Any]:
        reads.append(user_id)
        return {}

    monkeypatch.setattr(user_feed, "read_states", counted)
    monkeypatch.setattr(user_feed, "RING_COALESCE_SECONDS", 1.0)  # far longer than two loop turns

    async def sent(frame: str) -> None:
        return None

    async def until_settled(feed: user_feed.UserFeed) -> None:
        # A read after the join's, and none under way or rung for since.
        while len(reads) < 2 or feed.wake.is_set() or feed.lock.locked():
            await asyncio.sleep(0.01)

    async def scenario() -> None:
        feed = user_feed.UserFeed(7)
        await feed.join(sent)  # the joining socket's snapshot: read 1
        feed.ring()
        await asyncio.sleep(0)  # without the window, read 2 is under way by now
        feed.ring()  # and this one would make read 3
        await asyncio.wait_for(until_settled(feed), 30)
        feed.leave(sent)

    asyncio.run(scenario())
    assert reads == [7, 7]


# ---------------------------------------------------------------- the read


@pytest.mark.django_db
def test_the_states_of_all_the_users_sessions_are_one_query_and_only_theirs() -> None:
    project = factories.ProjectFactory()
    other_project = factories.ProjectFactory(path=project.path)
    second = factories.ProjectFactory(owner=project.owner, path=project.path)
    idle = factories.SessionFactory(project=project)
    waiting = factories.SessionFactory(project=second)
    run = factories.RunFactory(session=waiting, status=RunStatus.AWAITING_APPROVAL)
    factories.JournalEventFactory(run=run, seq=1, type=EventType.RUN_STARTED, payload={})
    factories.JournalEventFactory(run=run, seq=2, type=EventType.APPROVAL_REQUESTED, payload={})
    factories.JournalEventFactory(run=run, seq=3, type=EventType.TOKEN_DELTA)
    PendingIntent.objects.create(session=waiting, client_id="q-1", text="then lint")
    PendingIntent.objects.create(session=waiting, client_id="q-2", text="gone", state="deleted")
    failed = factories.SessionFactory(project=project)
    factories.RunFactory(session=failed, status=RunStatus.COMPLETED)
    last = factories.RunFactory(session=failed, status=RunStatus.FAILED)
    others = factories.SessionFactory(project=other_project)
    factories.RunFactory(session=others, status=RunStatus.RUNNING)

    with CaptureQueriesContext(connection) as queries:
        states = read_states(project.owner.pk)
    assert len(queries) == 1
    assert set(states) == {idle.pk, waiting.pk, failed.pk}  # never another user's
    assert states[idle.pk].idle
    assert (states[waiting.pk].run_id, states[waiting.pk].run_status) == (run.pk, "awaiting_approval")
    assert (states[waiting.pk].queued, states[waiting.pk].waiting_seq) == (1, 2)
    assert states[waiting.pk].project_id == second.pk
    assert (states[failed.pk].run_id, states[failed.pk].last_run_id) == (None, last.pk)
    assert states[failed.pk].last_run_status == "failed" and not states[failed.pk].idle


@pytest.mark.django_db
def test_only_what_changed_is_a_delta() -> None:
    session = factories.SessionFactory()
    kept = factories.SessionFactory(project=session.project)
    before = read_states(session.project.owner.pk)
    factories.RunFactory(session=session, status=RunStatus.RUNNING)
    gone = kept.pk
    kept.delete()
    found = changes(before, read_states(session.project.owner.pk))
    assert [s.id for s in found.changed] == [session.pk] and found.changed[0].run_status == "running"
    assert found.removed == [gone]


# ---------------------------------------------------------------- the channel


@pytest.mark.django_db(transaction=True)
def test_a_change_in_session_b_reaches_the_socket_watching_session_a(live: LiveStack, layer: str) -> None:
    # With Redis the repair poll never comes: only the doorbell can bring the changes.
    live.start_daphne(HERMESWEB_LIVE_USER_SAFETY_POLL_SECONDS=NEVER)
    live.start_runner()
    a = factories.SessionFactory()
    b = factories.SessionFactory(project=a.project)
    strangers = factories.SessionFactory()  # another user's
    socket = live.socket(a.pk, session_cookie(a.project.owner))
    socket.subscribe()
    socket.send(type="sessions")
    snapshot = socket.until(lambda f: f["type"] == "sessions")[-1]
    assert snapshot["snapshot"] is True and snapshot["sessions"] == []  # every session is idle

    theirs = services.do_submit_message(strangers, client_id="s-1", text="approve this write").run
    mine = services.do_submit_message(b, client_id="b-1", text="approve this write").run
    assert theirs is not None and mine is not None
    # The runner's ring (its journal writer, after commit) brings the request.
    waiting = until_state(socket, b.pk, lambda s: s["run_status"] == "awaiting_approval")
    assert waiting["run_id"] == mine.pk and waiting["waiting_seq"] and waiting["title"] == b.title
    # An intent queued from the web (intents' ring) brings its count.
    services.do_submit_message(b, client_id="b-2", text="then lint", mode="queue")
    assert until_state(socket, b.pk, lambda s: s["queued"] == 1)["run_status"] == "awaiting_approval"
    # A cancel ends the run: the queue drains into the next turn, which asks again.
    controls.do_cancel(Run.objects.get(pk=mine.pk))
    drained = until_state(socket, b.pk, lambda s: s["queued"] == 0 and s["run_id"] not in (None, mine.pk))
    assert drained["last_run_id"] == drained["run_id"]

    wait_for_run(theirs.pk, RunStatus.AWAITING_APPROVAL)
    socket.quiet(1.0)
    seen = {s["id"] for f in sessions_frames(socket) for s in f["sessions"]}
    assert seen == {b.pk}, "only the user's own sessions, and only the one that changed"


@pytest.mark.django_db(transaction=True)
def test_a_page_with_no_session_follows_the_states_on_its_own_socket(live: LiveStack) -> None:
    live.start_daphne(HERMESWEB_LIVE_USER_SAFETY_POLL_SECONDS=NEVER)
    session = factories.SessionFactory(title="Refactor the parser")
    run = factories.RunFactory(session=session, status=RunStatus.RUNNING)
    socket = user_socket(live, session_cookie(session.project.owner))
    socket.send(type="subscribe")
    assert socket.until(lambda f: f["type"] == "error")[-1]["code"] == "bad_request"
    socket.send(type="sessions")
    snapshot = socket.until(lambda f: f["type"] == "sessions")[-1]
    assert [(s["id"], s["run_id"], s["title"]) for s in snapshot["sessions"]] == [
        (session.pk, run.pk, "Refactor the parser")
    ]
    services.do_submit_message(session, client_id="q-1", text="then lint", mode="queue")
    assert until_state(socket, session.pk, lambda s: s["queued"] == 1)["run_id"] == run.pk


@pytest.mark.django_db(transaction=True)
def test_an_anonymous_socket_on_the_user_channel_is_refused(live: LiveStack) -> None:
    live.start_daphne()
    ws = connect(f"ws://127.0.0.1:{live.port}/ws/live/", origin=live.origin(), proxy=None)  # type: ignore[arg-type]
    assert LiveSocket(live.sockets.enter_context(ws)).close_code() == 4401


@pytest.mark.hermes
@pytest.mark.django_db(transaction=True)
def test_a_hermes_session_asking_for_approval_reaches_the_users_other_socket(
    live: LiveStack, settings: Any, hermes_agent_config: AgentConfig, scripted_llm: ScriptedLLM
) -> None:
    # The web side validates agent names against its own registry.
    agents = {"HERMESWEB_AGENTS": json.dumps({"hermes": hermes_agent_config})}
    configured = load_agents(settings.DATA_DIR, agents)
    settings.HERMESWEB_AGENTS = {**settings.HERMESWEB_AGENTS, "hermes": configured["hermes"]}
    live.start_daphne(HERMESWEB_LIVE_USER_SAFETY_POLL_SECONDS=NEVER)
    live.start_runner(**agents)
    a = factories.SessionFactory(project__agent="hermes")
    b = factories.SessionFactory(project=a.project)
    (Path(a.project.path) / "doomed").mkdir()
    scripted_llm.enqueue(tool_call("terminal", {"command": "rm -rf doomed"}), text("Done with the command."))
    socket = user_socket(live, session_cookie(a.project.owner))
    socket.send(type="sessions")
    socket.until(lambda f: f["type"] == "sessions")

    run = services.do_submit_message(b, client_id="h-1", text="Clean up the doomed directory").run
    assert run is not None
    # Hermes starts slowly on a busy machine: a generous bound, left as soon as the frame arrives.
    waiting = until_state(socket, b.pk, lambda s: s["run_status"] == "awaiting_approval", timeout=180)
    assert waiting["run_id"] == run.pk and waiting["waiting_seq"]
    request = Run.objects.get(pk=run.pk).events.get(type="approval.requested")
    controls.do_respond_approval(run, request.payload["approval_id"], "deny")
    done = until_state(socket, b.pk, lambda s: s["run_id"] is None, timeout=180)
    assert (done["last_run_id"], done["last_run_status"]) == (run.pk, "completed")
