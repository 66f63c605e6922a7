"""ACP terminals, as the runner runs them (runs/runner/terminals.py) for the demo agent's `terminal`.

Issue 44 ("The client side of ACP"); docs/runner.md ("Client capabilities"). The command runs in
the agent's own sandbox, as the agent's account, with the project as cwd; its output is journaled
while it runs; `outputByteLimit` cuts from the start at a character; Stop kills it, the turn's end
releases it, and a runner killed with SIGKILL leaves none of its processes behind.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from pathlib import Path
from typing import Any

import acp
import pytest
from django.conf import settings
from django.test import Client

from runs.models import RunStatus
from runs.runner.account import agent_account
from runs.runner.sandbox import Launch
from runs.runner.terminals import Terminals, cut_from_start
from tests import factories
from tests.support import ptree
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
from tests.support.workspace import SANDBOX, shell_runner, turn

JSON = "application/json"

needs_sandbox = pytest.mark.skipif(SANDBOX != "auto", reason="terminals run in the agent's sandbox: bwrap")


def reply(run: Any) -> str:
    return state(run)["text"]


def printed(run: Any) -> str:
    return "".join(e.payload["delta"] for e in events(run) if e.type == "terminal.output")


def pids_running(runner: Proc, marker: str) -> list[int]:
    """The runner's descendants whose command line holds `marker` (a terminal's command)."""
    return [pid for pid in ptree.descendants(runner.pid) if marker in " ".join(ptree.cmdline(pid))]


@pytest.fixture
def runner(runners: list[Proc], logs: Path) -> Proc:
    return shell_runner(runners, logs, "terminals")


@pytest.fixture
def session(user: Any) -> Any:
    return factories.SessionFactory(project=factories.ProjectFactory(owner=user, agent="demo"))


def test_the_byte_limit_cuts_from_the_start_at_a_character() -> None:
    assert cut_from_start("abc", 10) == ("abc", False)
    assert cut_from_start("héllo wörld", 7) == (" wörld", True)  # "ö" is two bytes: 7 bytes kept
    text, cut = cut_from_start("ééé", 3)  # the cut falls inside an 'é': that character goes
    assert (text, cut) == ("é", True)
    assert cut_from_start("abc", 0) == ("", True)


@needs_sandbox
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_output_is_journaled_live_while_the_command_runs(runner: Proc, session: Any) -> None:
    release = Path(session.project.path) / "go"
    run = run_of(
        submit(
            session,
            "terminal printf '\\033[31mfirst\\033[0m\\n'; "
            "while [ ! -e go ]; do sleep 0.05; done; echo second",
        )
    )
    first = wait_event(run, "terminal.output", timeout=60)
    assert "\x1b[31mfirst\x1b[0m" in first.payload["delta"]
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING  # the command still runs: this came live
    # The tool card refers to the terminal whose output this is.
    card = next(e for e in events(run) if e.type == "tool.started")
    assert card.payload["content"] == [{"type": "terminal", "terminal_id": first.payload["terminal_id"]}]
    release.write_text("")
    wait_status(run, RunStatus.COMPLETED, RunStatus.FAILED, timeout=60, log=runner.log)
    assert printed(run).endswith("second\n")
    assert "exit 0 signal None truncated False" in reply(run)
    assert state(run)["terminals"][first.payload["terminal_id"]] == printed(run)
    assert_journal_well_formed(run)


@needs_sandbox
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_the_output_byte_limit_keeps_the_end(runner: Proc, session: Any) -> None:
    # The last 11 bytes begin inside the 'é' (two bytes): that character goes whole.
    run = turn(session, "terminal limit=11 printf 'start-0123456789-héllo-wörld'", runner)
    found = re.search(r"truncated (\w+) output (\d+) bytes: '(.*)'", reply(run))
    assert found, reply(run)
    assert (found.group(1), found.group(2), found.group(3)) == ("True", "10", "llo-wörld")
    # The journal shows everything the command printed; only what the agent gets is cut.
    assert printed(run) == "start-0123456789-héllo-wörld"


@needs_sandbox
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_it_runs_in_the_agents_sandbox_as_the_agents_account(runner: Proc, session: Any) -> None:
    secret = Path(settings.DATA_DIR) / f"terminal-canary-{uuid.uuid4().hex}"
    secret.write_text("canary\n")
    try:
        run = turn(
            session,
            f"terminal echo uid=$(id -u) cwd=$(pwd); cat {secret} || echo hidden; "
            "ls /proc | grep -c '^[0-9]'",
            runner,
        )
    finally:
        secret.unlink()
    out = printed(run)
    account = agent_account()
    if account is not None:  # a root runner: the agent's account, never root
        assert f"uid={account.uid}" in out
    assert f"cwd={session.project.path}" in out
    assert "hidden" in out.splitlines() and "canary" not in out.splitlines()  # the data directory hidden
    processes = int(out.strip().splitlines()[-1])
    assert processes <= 10, out  # its own PID namespace: bwrap's init, the shell, ls, grep


@needs_sandbox
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_stop_kills_the_command(runner: Proc, session: Any, user: Any) -> None:
    marker = f"sleep 3{uuid.uuid4().int % 100:02d}1"
    run = run_of(submit(session, f"terminal {marker}"))
    wait_event(run, "tool.started", timeout=60)
    wait_for(lambda: pids_running(runner, marker), 30, what="the terminal's command")
    running = pids_running(runner, marker)
    client = Client()
    client.force_login(user)
    assert client.post(f"/api/runs/{run.pk}/cancel", content_type=JSON).status_code == 200
    wait_status(run, RunStatus.CANCELLED, timeout=60, log=runner.log)
    wait_for(lambda: not any(ptree.alive(pid) for pid in running), 30, what="the command to be killed")
    assert_journal_well_formed(run)


@needs_sandbox
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_the_turns_end_releases_a_terminal_left_running(runner: Proc, session: Any) -> None:
    marker = f"sleep 3{uuid.uuid4().int % 100:02d}2"
    run = turn(session, f"terminal leave {marker}", runner)
    assert "left term-" in reply(run)
    wait_for(lambda: not pids_running(runner, marker), 30, what="the released command to go")


@needs_sandbox
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_a_runner_killed_with_sigkill_leaves_no_terminal_behind(runner: Proc, session: Any) -> None:
    marker = f"sleep 3{uuid.uuid4().int % 100:02d}3"
    run = run_of(submit(session, f"terminal {marker}"))
    wait_event(run, "tool.started", timeout=60)
    wait_for(lambda: pids_running(runner, marker), 30, what="the terminal's command")
    tree = ptree.descendants(runner.pid)
    command = pids_running(runner, marker)
    runner.kill9()
    wait_for(lambda: not any(ptree.alive(pid) for pid in tree), 30, what="every process of the runner to go")
    assert not any(ptree.alive(pid) for pid in command)


# ---------------------------------------------------------------- real Hermes


@pytest.fixture
def hermes_runner(runners: list[Proc], logs: Path, hermes_agent_config: Any) -> Proc:
    agents = json.dumps({"hermes": hermes_agent_config})
    proc = start_runner(logs, "hermes-terminals", HERMESWEB_AGENTS=agents)
    runners.append(proc)
    return proc


@pytest.fixture
def hermes_session(settings: Any, hermes_agent_config: Any) -> Any:
    from runs.agents import load_agents

    environ = {"HERMESWEB_AGENTS": json.dumps({"hermes": hermes_agent_config})}
    settings.HERMESWEB_AGENTS = {**settings.HERMESWEB_AGENTS, **load_agents(settings.DATA_DIR, environ)}
    return factories.SessionFactory(project__agent="hermes")


@pytest.mark.hermes
@pytest.mark.timeout(180)
@pytest.mark.django_db(transaction=True)
def test_hermes_offered_files_and_terminals_still_runs_its_own_tools(
    hermes_runner: Proc, hermes_session: Any, scripted_llm: Any
) -> None:
    """Hermes (0.19) reads no client capability: its turns work as before, its tools run
    themselves (no `terminal.output` from a client terminal), and it asks nothing of ours."""
    from tests.support.scripted_llm import text, tool_call

    scripted_llm.enqueue(
        tool_call("terminal", {"command": "echo from-hermes > made-by-hermes.txt"}),
        text("Made the file."),
    )
    run = turn(hermes_session, "Make a file", hermes_runner)
    assert "Made the file." in reply(run)
    assert (Path(hermes_session.project.path) / "made-by-hermes.txt").read_text() == "from-hermes\n"
    assert printed(run) == ""
    assert "terminal term-" not in hermes_runner.log()  # no client terminal was started
    assert_journal_well_formed(run)


# ---------------------------------------------------------------- the registry itself


def plain_launcher(command: str, args: list[str]) -> Any:
    """An unsandboxed launch, as for an agent with `sandbox = "none"` (the argv as given)."""

    async def launch() -> Launch:
        return Launch(command, args, {"PATH": "/usr/bin:/bin"}, sandboxed=False)

    return launch()


def test_a_terminal_belongs_to_its_session_and_takes_cwd_and_env(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    journaled: list[Any] = []

    async def scenario() -> None:
        terminals = Terminals(plain_launcher)
        made = await terminals.create(
            "s1", "echo $GREETING; pwd", [], {"GREETING": "hi"}, "sub", None, journaled.extend, str(tmp_path)
        )
        exited = await terminals.wait_for_exit("s1", made.terminal_id)
        assert (exited.exit_code, exited.signal) == (0, None)
        output = terminals.output("s1", made.terminal_id)
        assert output.output == f"hi\n{tmp_path}/sub\n" and not output.truncated
        assert output.exit_status is not None and output.exit_status.exit_code == 0
        with pytest.raises(acp.RequestError):
            terminals.output("s2", made.terminal_id)  # another session's terminal is not there
        terminals.release("s1", made.terminal_id)
        with pytest.raises(acp.RequestError):
            terminals.output("s1", made.terminal_id)  # released: gone

        held = await terminals.create("s1", "sleep", ["60"], {}, "", None, None, str(tmp_path))
        assert terminals.output("s1", held.terminal_id).exit_status is None
        terminals.kill("s1", held.terminal_id)
        killed = await terminals.wait_for_exit("s1", held.terminal_id)
        assert (killed.exit_code, killed.signal) == (None, "SIGKILL")
        terminals.release_all()
        assert terminals.open == {}

    asyncio.run(scenario())
    assert "".join(e.payload["delta"] for e in journaled) == f"hi\n{tmp_path}/sub\n"
    assert {e.payload["terminal_id"] for e in journaled} == {e.payload["terminal_id"] for e in journaled[:1]}
