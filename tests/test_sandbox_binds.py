"""What the sandbox binds is what the runner checked, and agents never run as root.

Issue 38 items 1 and 5; docs/security.md ("The agent sandbox"). The attack: a user's agent,
inside its own project, swaps a symlink to another user's project in for a directory that is a
project of the same user (renameat2 with RENAME_EXCHANGE, in a loop). A runner that checks the
path and then binds it by name mounts the other user's project into the next agent's sandbox.
Here the flipper runs for the whole test while agents start, by the runner's own launch code
(many starts), through a real runner with the demo agent, and with real Hermes.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from projects.pathfd import UnsafePath, open_directory
from runs.agents import AgentSpec
from runs.models import RunStatus
from runs.runner import sandbox
from runs.runner.agents import ProjectPathRefused, place_agent
from tests import factories
from tests.support import ptree
from tests.support.procs import Proc, start_runner, wait_for
from tests.support.runs import run_of, submit, wait_status
from tests.test_sandbox import Probe, needs_bwrap, tool_output

RENAME_EXCHANGE = 2
AT_FDCWD = -100
MARKER = "bobs-private-marker.txt"


class Flipper:
    """Swaps `real` and a symlink to `foreign` with renameat2(RENAME_EXCHANGE), nonstop."""

    def __init__(self, real: Path, foreign: Path, interval: float = 0.0) -> None:
        # With an interval the real directory stays in place between flips long enough for a
        # whole agent start (bwrap refuses a bind whose directory moved while it mounted it).
        self.interval = interval
        self.real, self.link = os.fsencode(real), os.fsencode(real.parent / ".evil")
        os.symlink(foreign, self.link)
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.stop = threading.Event()
        self.flips = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            if self.libc.renameat2(AT_FDCWD, self.real, AT_FDCWD, self.link, RENAME_EXCHANGE) == 0:
                self.flips += 1
            if self.interval and self.flips % 2 == 0:
                self.stop.wait(self.interval)

    def __enter__(self) -> Flipper:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        if os.path.islink(self.real):  # leave the real directory in place
            self.libc.renameat2(AT_FDCWD, self.real, AT_FDCWD, self.link, RENAME_EXCHANGE)


@pytest.fixture
def alice_and_bob(user: Any, other_user: Any) -> Iterator[tuple[Any, Any]]:
    """Alice's project `outer`, her project `outer/inner` (the flipper's target), Bob's project."""
    outer = factories.ProjectFactory(owner=user, agent="demo")
    inner_path = Path(outer.path) / "inner"
    inner_path.mkdir()
    (inner_path / "alices.txt").write_text("alice\n")
    inner = factories.ProjectFactory(owner=user, agent="demo", path=str(inner_path))
    bob = factories.ProjectFactory(owner=other_user, agent="demo")
    (Path(bob.path) / MARKER).write_text("private\n")
    yield inner, bob


@needs_bwrap
@pytest.mark.django_db
def test_a_symlink_swapped_in_after_the_check_never_binds_another_users_project(
    alice_and_bob: tuple[Any, Any],
) -> None:
    inner, bob = alice_and_bob
    probe = AgentSpec(name="demo", command="/bin/sh", args=["-c", "ls -A; id -u"])
    bound = refused = 0
    with Flipper(Path(inner.path), Path(bob.path)) as flipper:
        for _ in range(200):
            try:
                # What the runner does before an agent starts: check the path, then launch.
                placement = place_agent(inner.pk, inner.path, "demo")
                launch = sandbox.prepare(
                    probe, "/bin/sh", cwd=inner.path, project=placement.project,
                    state_dir=placement.state_dir, data_dir=settings.DATA_DIR,
                    roots=settings.HERMESWEB_ALLOWED_ROOTS,
                )  # fmt: skip
            except (ProjectPathRefused, UnsafePath):
                refused += 1
                continue
            try:
                done = subprocess.run(
                    [launch.command, *launch.args], env=launch.env, pass_fds=launch.fds,
                    capture_output=True, text=True, timeout=30,
                )  # fmt: skip
            finally:
                launch.close_fds()
            assert MARKER not in done.stdout, f"another user's project was bound: {done.stdout!r}"
            if "alices.txt" in done.stdout:
                bound += 1
    print(f"flips={flipper.flips} bound={bound} refused={refused}")
    assert flipper.flips > 1000 and bound > 0  # the race was run, and agents did start


def test_a_path_with_a_symlink_is_not_opened(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "real" / "sub").mkdir()
    for path in (tmp_path / "link", tmp_path / "link" / "sub"):
        with pytest.raises(UnsafePath):
            open_directory(path)
    fd = open_directory(tmp_path / "real" / "sub")
    try:
        assert os.readlink(f"/proc/self/fd/{fd}") == str(tmp_path / "real" / "sub")
    finally:
        os.close(fd)


def demo_runner(runners: list[Proc], logs: Path) -> Proc:
    import dataclasses

    spec = dataclasses.asdict(settings.HERMESWEB_AGENTS["demo"])
    spec.pop("name")
    spec["env"] = {**spec["env"], "HERMESWEB_DEMO_DELAY": "0.002", "HERMESWEB_DEMO_SHELL": "1"}
    # Idle agents stop after a second: each turn below starts its agent anew.
    proc = start_runner(
        logs, "binds", HERMESWEB_AGENTS=json.dumps({"demo": spec}), HERMESWEB_AGENT_IDLE_SECONDS="1"
    )
    runners.append(proc)
    return proc


def agents_of(runner: Proc) -> list[int]:
    return [pid for pid in ptree.descendants(runner.pid) if "runs.demo_agent" in " ".join(ptree.cmdline(pid))]


@needs_bwrap
@pytest.mark.timeout(180)
@pytest.mark.django_db(transaction=True)
def test_the_demo_agent_started_while_the_flipper_runs_sees_only_its_own_project(
    runners: list[Proc], logs: Path, alice_and_bob: tuple[Any, Any]
) -> None:
    inner, bob = alice_and_bob
    runner = demo_runner(runners, logs)
    session = factories.SessionFactory(project=inner)
    completed = 0
    with Flipper(Path(inner.path), Path(bob.path), interval=0.05):
        for _ in range(4):
            run = run_of(submit(session, "shell ls -A; echo uid=$(id -u)"))
            wait_status(run, RunStatus.COMPLETED, RunStatus.FAILED, timeout=60, log=runner.log)
            run.refresh_from_db()
            output = tool_output(run)
            assert MARKER not in output and MARKER not in run.error
            if run.status == RunStatus.COMPLETED:
                completed += 1
                assert "alices.txt" in output
                assert Probe.results(output)["uid"] != "0"  # item 5: never root
            wait_for(lambda: not agents_of(runner), 20, what="the idle agent to stop")
    assert completed > 0


@needs_bwrap
@pytest.mark.django_db
def test_a_root_runners_agent_runs_as_the_agent_account_and_reads_no_root_file(
    alice_and_bob: tuple[Any, Any],
) -> None:
    if os.geteuid() != 0:
        pytest.skip("a runner that is not root starts agents as its own user")
    inner, _ = alice_and_bob
    script = "id -u; cat /etc/shadow >/dev/null 2>&1 && echo shadow=read; echo x > mine && echo wrote"
    probe = AgentSpec(name="demo", command="/bin/sh", args=["-c", script])
    placement = place_agent(inner.pk, inner.path, "demo")
    launch = sandbox.prepare(
        probe, "/bin/sh", cwd=inner.path, project=placement.project, state_dir=placement.state_dir,
        data_dir=settings.DATA_DIR, roots=settings.HERMESWEB_ALLOWED_ROOTS,
    )  # fmt: skip
    try:
        done = subprocess.run(
            [launch.command, *launch.args], env=launch.env, pass_fds=launch.fds,
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    finally:
        launch.close_fds()
    uid, *rest = done.stdout.split()
    assert int(uid) != 0 and "shadow=read" not in rest and "wrote" in rest, done
    assert (Path(inner.path) / "mine").stat().st_uid == int(uid)


@needs_bwrap
@pytest.mark.hermes
@pytest.mark.timeout(240)
@pytest.mark.django_db(transaction=True)
def test_hermes_started_while_the_flipper_runs_sees_only_its_own_project(
    runners: list[Proc],
    logs: Path,
    settings: Any,
    alice_and_bob: tuple[Any, Any],
    hermes_agent_config: Any,
    scripted_llm: Any,
) -> None:
    from runs.agents import _spec
    from tests.support.scripted_llm import text, tool_call
    from tests.test_sandbox_hermes import tool_results

    spec = {**hermes_agent_config, "cumulative_usage": True, "steer": "slash"}
    settings.HERMESWEB_AGENTS = {**settings.HERMESWEB_AGENTS, "hermes": _spec("hermes", spec, "test")}
    runner = start_runner(logs, "binds-hermes", HERMESWEB_AGENTS=json.dumps({"hermes": spec}))
    runners.append(runner)
    inner, bob = alice_and_bob
    inner.agent = "hermes"
    inner.save(update_fields=["agent"])
    session = factories.SessionFactory(project=inner)
    with Flipper(Path(inner.path), Path(bob.path), interval=0.05):
        # Until one turn's agent started (a start the flipper caught mid-swap is refused; its
        # script stays queued for the next turn, so only the first turn enqueues).
        for attempt in range(5):
            if attempt == 0:
                scripted_llm.enqueue(
                    tool_call("terminal", {"command": "ls -A; echo uid=$(id -u)"}), text("Listed.")
                )
            run = run_of(submit(session, "List the project"))
            wait_status(run, RunStatus.COMPLETED, RunStatus.FAILED, timeout=150, log=runner.log)
            run.refresh_from_db()
            assert MARKER not in run.error
            if run.status == RunStatus.COMPLETED:
                break
    assert run.status == RunStatus.COMPLETED, run.error
    listing = tool_results(scripted_llm.scripted_requests[-1])
    assert "alices.txt" in listing and MARKER not in listing, listing
    assert Probe.results(listing)["uid"] != "0"
