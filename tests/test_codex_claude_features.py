"""Codex and Claude, offline: the matrix cells beyond a turn (docs/agents.md, "Feature x agent").

Restart and load, fork, titles, slash commands, images, modes and models, cancel mid-tool — each
proved by what reaches the scripted model server (tests/support/scripted_llm.py) or by what the
runner stores, with the same runner setup as tests/test_codex_and_claude.py. Steps that share a
conversation share one session (a cold Claude turn costs seconds on a busy 2-core box).
"""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from projects.models import Session
from runs.controls import do_cancel, do_respond_approval
from runs.fork import do_fork_session
from runs.models import Run, RunStatus
from tests import factories
from tests.support.images import png
from tests.support.npm_agents import agents_bin, entry_for, shell_call
from tests.support.procs import Proc, start_runner, wait_for
from tests.support.runs import (
    assert_journal_well_formed,
    events,
    run_of,
    state,
    submit,
    wait_event,
    wait_status,
)
from tests.support.scripted_llm import ScriptedLLM, request_text, text, tool_call
from tests.test_sandbox import needs_bwrap

# `hermes`: the real-agent tests, run once (bin/test's SQLite pass), not again on PostgreSQL.
pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.hermes,
    needs_bwrap,
    pytest.mark.timeout(420),
]

AGENTS = ["codex", "claude"]
TURN = 150.0  # a cold first turn on a busy 2-core box: Claude ~5 s alone, Codex ~2 s
JSON = "application/json"


@pytest.fixture(scope="session")
def bin_dir() -> Path:
    return agents_bin()


@pytest.fixture(params=AGENTS)
def agent(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def entry(agent: str, tmp_path: Path, scripted_llm: ScriptedLLM, bin_dir: Path) -> dict[str, Any]:
    configured = entry_for(agent, tmp_path, scripted_llm, bin_dir)
    if agent == "claude":
        # Claude's "sonnet" alias names this id, which the scripted server answers as the conversation.
        configured["env"]["ANTHROPIC_DEFAULT_SONNET_MODEL"] = CHOSEN_MODEL["claude"]
    return configured


@pytest.fixture
def agents_env(agent: str, entry: dict[str, Any]) -> dict[str, str]:
    return {"HERMESWEB_AGENTS": json.dumps({agent: entry})}


@pytest.fixture
def runner(runners: list[Proc], logs: Path, agent: str, agents_env: dict[str, str]) -> Proc:
    proc = start_runner(logs, f"{agent}-runner", **agents_env)
    runners.append(proc)
    return proc


@pytest.fixture
def session(db: None, settings: Any, agent: str, entry: dict[str, Any]) -> Any:
    # The web side validates agent names against its own registry.
    from runs.agents import load_agents

    configured = load_agents(settings.DATA_DIR, {"HERMESWEB_AGENTS": json.dumps({agent: entry})})
    settings.HERMESWEB_AGENTS = {**settings.HERMESWEB_AGENTS, agent: configured[agent]}
    # Untitled, so the agent's session_info_update title is kept (a user's name would win).
    return factories.SessionFactory(project__agent=agent, title="")


@pytest.fixture
def api(session: Any) -> Client:
    client = Client()
    client.force_login(session.project.owner)
    return client


def assert_nothing_else_left(run: Run, runner: Proc) -> None:
    """The proxy lets the agent reach the scripted server only: no refusal means no other try."""
    run.refresh_from_db()
    assert run.network_refused == 0, run.network_refused
    refusals = [line for line in runner.log().splitlines() if "network: refused" in line]
    assert not refusals, refusals


def image_parts(body: dict[str, Any]) -> list[str]:
    """The images of one request as data URLs: Responses `input_image`, Messages `image` blocks."""
    found: list[str] = []
    items = body.get("input") if isinstance(body.get("input"), list) else body.get("messages") or []
    for item in items:
        content = item.get("content") if isinstance(item, dict) else None
        for part in content if isinstance(content, list) else []:
            if not isinstance(part, dict):
                continue
            if part.get("type") == "input_image":
                found.append(str(part.get("image_url", "")))
            elif part.get("type") == "image" and isinstance(part.get("source"), dict):
                source = part["source"]
                found.append(f"data:{source.get('media_type')};base64,{source.get('data')}")
    return found


def conversation_since(llm: ScriptedLLM, before: int, holding: str) -> dict[str, Any]:
    """The first scripted request after `before` that holds `holding` (the turn's prompt)."""

    def find() -> dict[str, Any] | None:
        for body in llm.scripted_requests[before:]:
            if holding in request_text(body):
                return body
        return None

    return wait_for(find, TURN, what=f"a model request holding {holding!r}")


def send(api: Client, session: Any, prompt: str, attachments: list[int] | None = None) -> Run:
    body = {"client_id": uuid.uuid4().hex, "text": prompt, "attachments": attachments or []}
    response = api.post(f"/api/sessions/{session.pk}/messages", body, content_type=JSON)
    assert response.status_code in (200, 201, 202), response.content
    return Run.objects.get(pk=response.json()["run_id"])


def completes(run: Run, runner: Proc) -> Run:
    """Wait for the run to settle, then show why when it did not complete (not a timeout later)."""
    wait_status(run, RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, timeout=TURN, log=runner.log)
    said = [(e.type, e.payload) for e in events(run) if e.type in ("error", "done")]
    assert run.status == RunStatus.COMPLETED, (run.status, run.error, said)
    return run


def upload_png(api: Client, session: Any, image: bytes) -> int:
    file = SimpleUploadedFile("diagram.png", image, content_type="image/png")
    uploaded = api.post(f"/api/sessions/{session.pk}/attachments", {"file": file})
    assert uploaded.status_code == 201, uploaded.content
    return int(uploaded.json()["id"])


def test_a_conversation_keeps_its_context_across_a_restart_and_into_a_fork(
    agent: str,
    runners: list[Proc],
    logs: Path,
    agents_env: dict[str, str],
    session: Any,
    api: Client,
    scripted_llm: ScriptedLLM,
) -> None:
    # Turn one, with an image: it reaches the model; the agent names the session and lists commands.
    first = start_runner(logs, f"{agent}-first", **agents_env)
    runners.append(first)
    image = png(16, 16, (10, 120, 220))
    codeword = "PAPAYA-5151"
    scripted_llm.enqueue(text(f"Noted, the codeword is {codeword}."))
    one = send(
        api,
        session,
        f"Remember the codeword {codeword}; what is in ATTACH-7c1?",
        [upload_png(api, session, image)],
    )
    completes(one, first)
    assert_journal_well_formed(one)
    expected = f"data:image/png;base64,{base64.b64encode(image).decode()}"
    asked_one = conversation_since(scripted_llm, 0, "ATTACH-7c1")
    assert image_parts(asked_one) == [expected]
    if agent == "codex":
        # Claude's title is not waited for: twice in about ten runs (once in CI) none reached the
        # row within 150 s (docs/agents.md's matrix); Codex's arrived every time.
        titled = wait_for(
            lambda: Session.objects.filter(pk=session.pk).exclude(title="").first(), TURN, what="a title"
        )
        assert titled.title == f"Remember the codeword {codeword}; what is in ATTACH-7c1?"
        # The title's event is in the turn when it came before the turn's end; after, only on the row.
        assert all(e.payload["source"] == "agent" for e in events(one) if e.type == "title.updated")
    titled = wait_for(
        lambda: Session.objects.filter(pk=session.pk).exclude(commands=[]).first(), TURN, what="commands"
    )
    names = {command["name"] for command in titled.commands}
    assert {"compact", "rename"} <= names, names  # both agents' own commands, as they listed them
    assert_nothing_else_left(one, first)

    # The runner (and so the agent process) restarts: the next turn loads the agent session.
    assert first.stop() == 0
    second = start_runner(logs, f"{agent}-second", **agents_env)
    runners.append(second)
    before = len(scripted_llm.scripted_requests)
    scripted_llm.enqueue(text("You told me earlier."))
    two = send(api, session, "What was the codeword?")
    completes(two, second)
    assert_journal_well_formed(two)
    asked_two = request_text(conversation_since(scripted_llm, before, "What was the codeword?"))
    assert f"Remember the codeword {codeword}" in asked_two
    assert f"Noted, the codeword is {codeword}." in asked_two
    assert "You told me earlier." in state(two)["text"]
    assert f"Noted, the codeword is {codeword}." not in state(two)["text"]  # the replay is not journaled
    assert_nothing_else_left(two, second)

    # A fork's first turn continues from the parent's context, on an agent session of its own.
    session.refresh_from_db()
    fork = do_fork_session(session.project.owner, session.pk)
    # The fork keeps the parent's model (Codex's "mock-model[medium]", outside its catalog): it is
    # not sent again, as Codex would refuse it (runs/runner/forking.py, inherit_model).
    assert fork.model == session.model
    before = len(scripted_llm.scripted_requests)
    scripted_llm.enqueue(text("It was the papaya one."))
    turn = run_of(submit(fork, "Which fruit was it?"))
    completes(turn, second)
    assert_journal_well_formed(turn)
    asked_fork = request_text(conversation_since(scripted_llm, before, "Which fruit was it?"))
    assert f"Remember the codeword {codeword}" in asked_fork
    assert "What was the codeword?" in asked_fork and "You told me earlier." in asked_fork
    assert "It was the papaya one." in state(turn)["text"]
    fork.refresh_from_db()
    assert fork.agent_session_id and fork.agent_session_id != session.agent_session_id
    assert fork.fork_agent_session_id == ""
    # The parent's agent session is its own: the fork's question never reaches it.
    before = len(scripted_llm.scripted_requests)
    scripted_llm.enqueue(text("The parent goes on."))
    after = run_of(submit(session, "Carry on"))
    completes(after, second)
    asked_parent = request_text(conversation_since(scripted_llm, before, "Carry on"))
    assert "What was the codeword?" in asked_parent
    assert "Which fruit was it?" not in asked_parent
    assert_nothing_else_left(after, second)


# The config options each agent reported (recorded here): a model other than the script's, and
# the option that puts it in plan mode (Codex: `collaboration_mode`; Claude: its permission mode).
CHOSEN_MODEL = {"codex": "gpt-6-luna", "claude": "mock-model-b"}
CHOICES = {
    "codex": {"model": "gpt-6-luna", "collaboration_mode": "plan"},
    "claude": {"model": "sonnet", "mode": "plan"},
}


def test_chosen_config_options_reach_the_agent_before_the_next_turn(
    agent: str, runner: Proc, session: Any, api: Client, scripted_llm: ScriptedLLM
) -> None:
    scripted_llm.conversation_models.add(CHOSEN_MODEL[agent])
    scripted_llm.enqueue(text("First answer."))
    one = send(api, session, "Say something")
    completes(one, runner)
    assert conversation_since(scripted_llm, 0, "Say something")["model"] == scripted_llm.model
    options = {o["id"]: o for o in api.get(f"/api/sessions/{session.pk}").json()["config_options"]}
    choices = CHOICES[agent]
    for option_id, value in choices.items():
        assert value in [v["value"] for v in options[option_id]["values"]], (option_id, options[option_id])
    response = api.patch(f"/api/sessions/{session.pk}", {"config": choices}, content_type=JSON)
    assert response.status_code == 200, response.content

    before = len(scripted_llm.scripted_requests)
    scripted_llm.enqueue(text("Answered in plan mode."))
    two = send(api, session, "Plan the next step")
    completes(two, runner)
    assert_journal_well_formed(two)
    asked = conversation_since(scripted_llm, before, "Plan the next step")
    said = request_text(asked)
    assert asked["model"] == CHOSEN_MODEL[agent]
    assert "plan mode" in said.lower()
    body = api.get(f"/api/sessions/{session.pk}").json()
    current = {o["id"]: o["current"] for o in body["config_options"]}
    assert {k: current[k] for k in choices} == choices
    assert "Answered in plan mode." in state(two)["text"]
    assert_nothing_else_left(two, runner)


def test_cancel_mid_tool_ends_the_run_cancelled_once_and_the_session_goes_on(
    agent: str, runner: Proc, session: Any, scripted_llm: ScriptedLLM
) -> None:
    project = Path(session.project.path)
    name, arguments = shell_call(agent, "echo begun > begun.txt && sleep 120 && echo slept > slept.txt")
    if agent == "codex":
        arguments["yield_time_ms"] = 300_000  # else exec_command answers the model while it runs
    scripted_llm.enqueue(tool_call(name, arguments))
    run = run_of(submit(session, "Wait for a while"))

    def tool_running() -> bool:
        # Claude asks before a command that writes; the user allows it once.
        run.refresh_from_db()
        if run.status == RunStatus.AWAITING_APPROVAL:
            request = wait_event(run, "approval.requested")
            option = next(o["option_id"] for o in request.payload["options"] if o["kind"] == "allow_once")
            do_respond_approval(run, request.payload["approval_id"], option)
        # The command has begun, and the agent's tool call has reached the journal.
        return (project / "begun.txt").exists() and any(e.type == "tool.started" for e in events(run))

    wait_for(tool_running, TURN, what="the tool's command to start")
    assert do_cancel(run).status == "accepted"
    wait_status(run, RunStatus.CANCELLED, timeout=TURN, log=runner.log)
    assert_journal_well_formed(run)  # one terminal event: cancelled once
    assert [e.type for e in events(run)].count("tool.started") >= 1
    assert not (project / "slept.txt").exists()

    scripted_llm.reply_to("Are you still there?", text("Still here after the cancel."))
    after = run_of(submit(session, "Are you still there?"))
    completes(after, runner)
    assert_journal_well_formed(after)
    assert "Still here after the cancel." in state(after)["text"]
    assert_nothing_else_left(after, runner)


# Each agent's own plan tool, as its model calls it: Codex `update_plan`, Claude `TodoWrite`.
PLAN_CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "codex": (
        "update_plan",
        {
            "explanation": "Two steps.",
            "plan": [
                {"step": "Read the code", "status": "completed"},
                {"step": "Write the fix", "status": "in_progress"},
            ],
        },
    ),
    "claude": (
        "TodoWrite",
        {
            "todos": [
                {"content": "Read the code", "status": "completed", "activeForm": "Reading the code"},
                {"content": "Write the fix", "status": "in_progress", "activeForm": "Writing the fix"},
            ]
        },
    ),
}


# Codex: a scripted `update_plan` call made no `plan` update here (docs/agents.md, the matrix).
@pytest.mark.parametrize("agent", ["claude"])
def test_the_agents_plan_tool_becomes_the_runs_plan(
    agent: str, runner: Proc, session: Any, scripted_llm: ScriptedLLM
) -> None:
    name, arguments = PLAN_CALLS[agent]
    scripted_llm.enqueue(tool_call(name, arguments), text("Planned."))
    run = run_of(submit(session, "Make a plan"))
    completes(run, runner)
    assert_journal_well_formed(run)
    plans = [e.payload["entries"] for e in events(run) if e.type == "plan.updated"]
    assert plans, [e.type for e in events(run)]
    # Claude shows a step in progress by its `activeForm`.
    assert [(entry["content"], entry["status"]) for entry in plans[-1]] == [
        ("Read the code", "completed"),
        ("Writing the fix", "in_progress"),
    ]
    assert "Planned." in state(run)["text"]
    assert_nothing_else_left(run, runner)
