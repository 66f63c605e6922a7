"""The agent sandbox (bubblewrap): what an agent can read and write, with the demo agent.

Issue 22 item 1; docs/security.md ("The agent sandbox"). The argv is a pure function
(`runs.runner.sandbox.bwrap_argv`), tested as such; then a real runner starts the real demo
agent, whose test-only `shell` word runs a probe script as an agent's tool would, and the
probe says what it could read: the data directory (the SQLite database, `secret_key`),
another user's project, the runner's environ. The same probe with `sandbox = "none"` reads
them all, which is what the sandbox is for. Real Hermes: tests/test_sandbox_hermes.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client

from runs import agents
from runs.agents import AgentSpec, Bwrap, agent_state_dir
from runs.models import RunStatus
from runs.runner import sandbox
from runs.runner.account import AgentAccount
from runs.runner.sandbox import Bound, agent_env, bwrap_argv
from tests import factories
from tests.support.procs import Proc, start_runner
from tests.support.runs import assert_journal_well_formed, events, run_of, submit, wait_status

SPEC = AgentSpec(name="demo", command="/usr/bin/python3", args=["-m", "runs.demo_agent"])
HERMES = AgentSpec(name="hermes", command="/opt/hermes/bin/hermes-acp", env={"HERMES_HOME": "/srv/hermes"})

needs_bwrap = pytest.mark.skipif(
    agents.bwrap().path is None, reason=f"the sandbox needs bubblewrap: {agents.bwrap().problem}"
)


def pairs(argv: list[str], flag: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, arg in enumerate(argv) if arg == flag]


def singles(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == flag]


# ---------------------------------------------------------------- the argv (pure)


def test_the_argv_hides_the_data_dir_and_roots_and_binds_the_project_and_state_writable() -> None:
    argv = bwrap_argv(
        SPEC,
        "/usr/bin/python3",
        project=Bound(5, Path("/srv/roots/a/p1")),
        state_dir=Bound(6, Path("/srv/data/agents/7/demo")),
        data_dir=Path("/srv/data"),
        roots=[Path("/srv/roots/a"), Path("/srv/roots/b")],
        hide=[Path("/etc/hermesweb")],
        mask=[Path("/etc/agents.toml")],
        bwrap="/usr/bin/bwrap",
    )
    assert argv[0] == "/usr/bin/bwrap"
    for flag in ("--die-with-parent", "--unshare-pid", "--new-session"):
        assert flag in argv
    assert singles(argv, "--cap-drop") == ["ALL"]  # root keeps every capability otherwise
    # The network stays: the agent reaches its model server, on loopback too.
    assert not {"--unshare-net", "--unshare-all"} & set(argv)
    assert pairs(argv, "--ro-bind")[0] == ("/", "/")
    assert singles(argv, "--proc") == ["/proc"] and singles(argv, "--dev") == ["/dev"]
    hidden = singles(argv, "--tmpfs")
    assert set(hidden) == {"/tmp", "/run", "/srv/data", "/srv/roots/a", "/srv/roots/b", "/etc/hermesweb"}
    assert ("/dev/null", "/etc/agents.toml") in pairs(argv, "--ro-bind")
    # Bound by the descriptors the runner opened, never by name (a symlink swapped in meanwhile).
    assert "--bind" not in argv
    assert pairs(argv, "--bind-fd") == [("5", "/srv/roots/a/p1"), ("6", "/srv/data/agents/7/demo")]
    # Every hiding mount comes before the binds it must not cover.
    last_tmpfs = max(i for i, arg in enumerate(argv) if arg == "--tmpfs")
    assert last_tmpfs < argv.index("--bind-fd")
    assert argv[argv.index("--chdir") + 1] == "/srv/roots/a/p1"
    assert argv[argv.index("--") :] == ["--", "/usr/bin/python3", "-m", "runs.demo_agent"]
    # Values never ride in the argv (other users of the host see it): the environment is bwrap's own.
    assert "--setenv" not in argv and "--clearenv" not in argv


def test_code_under_tmp_is_bound_back_and_the_data_directory_hidden_again_after_it() -> None:
    # A checkout (and its virtualenv) under /tmp, as on a CI runner: the agent must still find
    # its interpreter and the product's code, and the data directory inside stays hidden.
    argv = bwrap_argv(
        SPEC,
        "/tmp/ci/.venv/bin/python",
        project=Bound(5, Path("/tmp/ci/var/projects/p")),
        state_dir=Bound(6, Path("/tmp/ci/var/agents/1/demo")),
        data_dir=Path("/tmp/ci/var"),
        roots=[Path("/tmp/ci/var/projects")],
        code=[Path("/tmp/ci"), Path("/tmp/ci/.venv")],
    )
    # The roots inside the data directory need no mount of their own.
    assert singles(argv, "--tmpfs") == ["/tmp", "/run", "/tmp/ci/var"]
    order = [
        (flag, argv[i + 1] if flag != "--bind-fd" else argv[i + 2])
        for i, flag in enumerate(argv)
        if flag in ("--tmpfs", "--ro-bind-try", "--bind-fd")
    ]
    assert order.index(("--ro-bind-try", "/tmp/ci")) < order.index(("--tmpfs", "/tmp/ci/var"))
    assert order.index(("--tmpfs", "/tmp")) < order.index(("--ro-bind-try", "/tmp/ci/.venv"))
    assert order.index(("--tmpfs", "/tmp/ci/var")) < order.index(("--bind-fd", "/tmp/ci/var/projects/p"))


def test_the_agents_code_is_its_virtualenv_and_the_products_checkout() -> None:
    from django.conf import settings

    from runs.runner.sandbox import code_dirs

    runner = [Path(settings.BASE_DIR).resolve(), Path(sys.prefix), Path(sys.base_prefix).resolve()]
    assert code_dirs("/tmp/ci/.venv/bin/python") == [*runner, Path("/tmp/ci/.venv")]
    assert code_dirs("hermes-acp") == runner


def test_a_virtualenvs_base_python_is_code_too(tmp_path: Path) -> None:
    from runs.runner.sandbox import code_dirs

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /opt/python/3.12/bin\ninclude-system-site-packages = false\n")
    assert code_dirs(str(venv / "bin" / "hermes-acp"))[-2:] == [venv, Path("/opt/python/3.12")]


def test_hermes_gets_the_operators_config_read_only_and_its_state_writable() -> None:
    config = Bound(7, Path("/d/agents/3/hermes/config.yaml"))
    argv = bwrap_argv(
        HERMES,
        "/opt/hermes/bin/hermes-acp",
        project=Bound(5, Path("/r/p")),
        state_dir=Bound(6, Path("/d/agents/3/hermes")),
        data_dir=Path("/d"),
        roots=[Path("/r")],
        hide=[Path("/srv/hermes")],
        read_only=[config],
    )
    assert "/srv/hermes" in singles(argv, "--tmpfs")
    binds = [i for i, arg in enumerate(argv) if arg in ("--bind-fd", "--ro-bind-fd")]
    # The config is bound after (over) the writable state directory.
    assert argv.index("/d/agents/3/hermes") < max(binds)
    assert pairs(argv, "--ro-bind-fd")[-1] == ("7", "/d/agents/3/hermes/config.yaml")


def test_the_environment_is_built_not_inherited() -> None:
    runner_env = {
        "PATH": "/venv/bin:/usr/bin",
        "LANG": "C.UTF-8",
        "DATABASE_URL": "postgres://u:pw@db/hermesweb",
        "SECRET_KEY": "s3cret",
        "REDIS_URL": "redis://x",
        "HOME": "/root",
        "TMPDIR": "/var/tmp/runner",
        "HERMES_HOME": "/root/.hermes",
    }
    spec = dataclasses.replace(
        HERMES, env={"HERMES_HOME": "/srv/hermes", "HOME": "/srv", "OPENAI_API_KEY": "k"}
    )
    env = agent_env(spec, Path("/d/agents/3/hermes"), sandboxed=True, environ=runner_env)
    assert env == {
        "PATH": "/venv/bin:/usr/bin",
        "LANG": "C.UTF-8",
        "OPENAI_API_KEY": "k",
        "HOME": "/d/agents/3/hermes",
        "HERMES_HOME": "/d/agents/3/hermes",
        "TMPDIR": "/tmp",
    }
    plain = agent_env(SPEC, Path("/d/agents/3/demo"), sandboxed=False, environ=runner_env)
    assert "HERMES_HOME" not in plain and plain["TMPDIR"] == "/var/tmp/runner"
    assert not {"DATABASE_URL", "SECRET_KEY", "REDIS_URL"} & set(plain)


def test_the_operators_own_files_are_hidden_too() -> None:
    assert sandbox.hidden_paths({}) == [Path("/etc/hermesweb")]  # where docs/deploy.md keeps secrets
    environ = {"HERMESWEB_SANDBOX_HIDE": "/srv/keys, /opt/x", "HERMESWEB_AGENTS_FILE": "/etc/a.toml"}
    assert sandbox.hidden_paths(environ) == [Path("/srv/keys"), Path("/opt/x"), Path("/etc/a.toml")]
    with pytest.raises(ValueError, match="not an absolute path"):
        sandbox.hidden_paths({"HERMESWEB_SANDBOX_HIDE": "keys"})


@pytest.fixture
def operator_hermes(tmp_path: Path) -> AgentSpec:
    """An operator's Hermes home as Hermes' installer lays it out: code, config, keys, sessions."""
    home = tmp_path / "operator" / ".hermes"
    command = home / "hermes-agent" / "venv" / "bin" / "hermes-acp"
    command.parent.mkdir(parents=True)
    command.write_text("#!/bin/sh\n")
    command.chmod(0o755)
    (home / "config.yaml").write_text("model: {provider: custom}\n")
    (home / ".env").write_text("OPENROUTER_API_KEY=k\n")
    (home / "state.db").write_text("the operator's own sessions\n")
    return AgentSpec(name="hermes", command=str(command), env={"HERMES_HOME": str(home)})


@pytest.mark.parametrize("mode", ["auto", "none"])
def test_hermes_shares_only_the_operators_config_and_keys(
    operator_hermes: AgentSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.setattr(agents, "bwrap", lambda: Bwrap("/usr/bin/bwrap", version="bubblewrap 0.8.0"))
    home = Path(operator_hermes.env["HERMES_HOME"])
    state = tmp_path / "data" / "agents" / "4" / "hermes"
    project = tmp_path / "roots" / "p"
    project.mkdir(parents=True)
    if mode == "none" and os.geteuid() == 0:
        # A root runner never starts an agent unsandboxed: it would run as root.
        with pytest.raises(sandbox.SandboxUnavailable, match="runs as root"):
            sandbox.prepare(
                dataclasses.replace(operator_hermes, sandbox=mode), operator_hermes.command,
                cwd=str(project), project=project, state_dir=state, data_dir=tmp_path / "data",
                roots=[tmp_path / "roots"], environ={"PATH": "/usr/bin", "HOME": str(tmp_path / "operator")},
            )  # fmt: skip
        return
    launch = sandbox.prepare(
        dataclasses.replace(operator_hermes, sandbox=mode), operator_hermes.command, cwd=str(project),
        project=project, state_dir=state, data_dir=tmp_path / "data", roots=[tmp_path / "roots"],
        environ={"PATH": "/usr/bin", "HOME": str(tmp_path / "operator")},
    )  # fmt: skip
    try:
        assert launch.env["HOME"] == launch.env["HERMES_HOME"] == str(state)
        if mode == "none":
            # No bind outside the sandbox: private copies, made again at each start.
            assert (state / "config.yaml").read_text() == (home / "config.yaml").read_text()
            assert (state / ".env").stat().st_mode & 0o777 == 0o600
            assert not (state / "state.db").exists()
            return
        argv = [launch.command, *launch.args]
        # The operator's sessions, memories and keys file are hidden (here under /tmp, hidden whole).
        assert any(home.is_relative_to(hidden) for hidden in singles(argv, "--tmpfs"))
        assert (str(home / "hermes-agent"), str(home / "hermes-agent")) in pairs(argv, "--ro-bind-try")
        bound = {dest: Path(os.readlink(f"/proc/self/fd/{fd}")) for fd, dest in pairs(argv, "--ro-bind-fd")}
        for name in ("config.yaml", ".env"):
            source = bound[str(state / name)]
            # The operator's own file, or (for a root runner's agent account) a read-only copy of it
            # outside the agent's writable state.
            assert source.read_text() == (home / name).read_text()
            assert source == home / name or not source.is_relative_to(state)
    finally:
        launch.close_fds()


# ---------------------------------------------------------------- when it applies, and the warnings


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agents, "bwrap", lambda: Bwrap(None, problem="bubblewrap (bwrap) is not installed"))


@pytest.fixture
def unprivileged_service(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner as a service user of its own (not root): agents run as that user."""
    monkeypatch.setattr(sandbox, "agent_account", lambda environ=None: None)


def test_a_root_runner_never_starts_an_agent_unsandboxed(
    no_bwrap: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        sandbox, "agent_account", lambda environ=None: AgentAccount("hermesweb-agent", 999, 999)
    )
    with pytest.raises(sandbox.SandboxUnavailable, match="runs as root"):
        sandbox.prepare(
            SPEC, "/usr/bin/python3", cwd=str(tmp_path), project=tmp_path, state_dir=tmp_path / "d" / "s",
            data_dir=tmp_path / "d", roots=[tmp_path],
        )  # fmt: skip


def test_without_bwrap_an_agent_runs_unsandboxed_and_says_why(
    no_bwrap: None, unprivileged_service: None, tmp_path: Path
) -> None:
    state = tmp_path / "data" / "agents" / "1" / "demo"
    launch = sandbox.prepare(
        SPEC, "/usr/bin/python3", cwd=str(tmp_path), project=tmp_path, state_dir=state,
        data_dir=tmp_path / "data", roots=[tmp_path],
    )  # fmt: skip
    assert not launch.sandboxed and "not installed" in launch.unsandboxed_because
    assert launch.command == "/usr/bin/python3" and launch.args == ["-m", "runs.demo_agent"]
    assert launch.env["HOME"] == str(state) and state.is_dir()
    assert state.stat().st_mode & 0o777 == 0o700
    assert agents.sandbox_warnings([SPEC]) == [
        "agent 'demo' runs unsandboxed: bubblewrap (bwrap) is not installed"
    ]


def test_an_agent_that_requires_the_sandbox_does_not_start_without_it(no_bwrap: None, tmp_path: Path) -> None:
    spec = dataclasses.replace(SPEC, sandbox="required")
    with pytest.raises(sandbox.SandboxUnavailable, match="requires the sandbox"):
        sandbox.prepare(
            spec, "/usr/bin/python3", cwd=str(tmp_path), project=tmp_path, state_dir=tmp_path / "s",
            data_dir=tmp_path, roots=[],
        )  # fmt: skip
    assert "cannot start" in agents.sandbox_warnings([spec])[0]


@pytest.mark.django_db
def test_health_and_doctor_warn_about_an_agent_configured_unsandboxed(api: Client, settings: Any) -> None:
    from django.core.management import call_command

    settings.HERMESWEB_AGENTS = {
        **settings.HERMESWEB_AGENTS,
        "loose": AgentSpec(name="loose", command="/bin/true", sandbox="none"),
    }
    factories.RunnerFactory(agent_capabilities={"demo": {"sandbox": "none"}}, id="r-loose")
    response = api.get("/api/health")
    assert response.status_code == 200 and response.json()["ok"] is True  # a warning, not a failure
    body = response.json()["sandbox"]
    assert body["ok"] is False
    assert any("'loose' runs unsandboxed" in w and 'sandbox = "none"' in w for w in body["warnings"])
    assert "runner r-loose runs agent 'demo' unsandboxed" in body["warnings"]

    out = _doctor(call_command)
    assert "agent 'loose' runs UNSANDBOXED" in out


def _doctor(call_command: Any) -> str:
    import io

    out = io.StringIO()
    call_command("doctor", "--skip-agents", stdout=out)
    return out.getvalue()


@needs_bwrap
@pytest.mark.django_db
def test_health_reports_bubblewrap_when_every_agent_is_sandboxed(api: Client, settings: Any) -> None:
    settings.HERMESWEB_AGENTS = {"demo": settings.HERMESWEB_AGENTS["demo"]}
    body = api.get("/api/health").json()["sandbox"]
    assert body == {"ok": True, "bwrap": agents.bwrap().path, "warnings": []}


# ---------------------------------------------------------------- a real agent tries


@dataclasses.dataclass
class Probe:
    """A shell script for an agent's tool, and how to read what it printed."""

    script: str
    outside: Path

    @staticmethod
    def build(
        *,
        secrets: dict[str, Path],
        other_project: Path,
        runner_pid: int,
        outside: Path,
        unmount: Path | None = None,
    ) -> Probe:
        """`unmount`: in the sandbox only (never on the host), try to lift the tmpfs over it first."""
        lines = [_check(name, f'cat "{path}"', "read", "hidden") for name, path in secrets.items()]
        if unmount is not None:
            canary = secrets["canary"]
            lines.append(
                _check("unmounted", f'umount "{unmount}" 2>/dev/null; cat "{canary}"', "read", "hidden")
            )
        lines += [
            _check("other", f'[ -n "$(ls -A "{other_project}" 2>/dev/null)" ]', "listed", "hidden"),
            _check("environ", f"cat /proc/{runner_pid}/environ", "read", "hidden"),
            "echo envleak=$(env | grep -cE '^(DATABASE_URL|SECRET_KEY|REDIS_URL)=')",
            "echo procs=$(ls /proc | grep -c '^[0-9]')",
            "echo uid=$(id -u)",
            _check("shadow", "cat /etc/shadow", "read", "hidden"),
            'echo home="$HOME" hermes_home="${HERMES_HOME:-unset}"',
            _check("outside", f'touch "{outside}/probe"', "written", "refused"),
            "echo ok > written-by-agent.txt && echo project=written",
        ]
        return Probe("; ".join(lines), outside)

    @staticmethod
    def results(output: str) -> dict[str, str]:
        """`name=value` pairs the script printed, from plain text or text inside JSON (Hermes)."""
        return dict(re.findall(r"\b([a-z_]+)=([^\s\"\\]+)", output))


def _check(name: str, test: str, yes: str, no: str) -> str:
    return f"if {test} >/dev/null 2>&1; then echo {name}={yes}; else echo {name}={no}; fi"


@pytest.fixture
def outside_dir() -> Iterator[Path]:
    """A writable directory outside every project, /tmp and the data directory."""
    path = Path(tempfile.mkdtemp(prefix="hermesweb-sandbox-", dir="/var/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def canary() -> Iterator[Path]:
    """A file in the data directory an agent must not read (beside the database and secret_key)."""
    path = Path(settings.DATA_DIR) / f"sandbox-canary-{uuid.uuid4().hex}"
    path.write_text("canary\n")
    yield path
    path.unlink(missing_ok=True)


def secrets_of_the_service(canary: Path) -> dict[str, Path]:
    secrets = {"canary": canary}
    if (Path(settings.DATA_DIR) / "secret_key").exists():
        secrets["keyfile"] = Path(settings.DATA_DIR) / "secret_key"
    if connection.vendor == "sqlite":
        secrets["db"] = Path(connection.settings_dict["NAME"])
    return secrets


def demo_runner(runners: list[Proc], logs: Path, mode: str) -> Proc:
    spec = dataclasses.asdict(settings.HERMESWEB_AGENTS["demo"])
    spec.pop("name")
    spec["env"] = {**spec["env"], "HERMESWEB_DEMO_DELAY": "0.002", "HERMESWEB_DEMO_SHELL": "1"}
    spec["sandbox"] = mode
    proc = start_runner(logs, f"sandbox-{mode}", HERMESWEB_AGENTS=json.dumps({"demo": spec}))
    runners.append(proc)
    return proc


def tool_output(run: Any) -> str:
    """What the agent's tool printed (its content: the command itself is in the arguments)."""
    return "\n".join(
        item.get("text", "")
        for e in events(run)
        if e.type == "tool.updated"
        for item in e.payload.get("content") or []
    )


@pytest.mark.timeout(90)
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("mode", [pytest.param("auto", marks=needs_bwrap), "none"])
def test_the_demo_agent_reads_nothing_of_the_service_or_other_projects_and_edits_its_own(
    runners: list[Proc], logs: Path, user: Any, other_user: Any, canary: Path, outside_dir: Path, mode: str
) -> None:
    runner = demo_runner(runners, logs, mode)
    mine = factories.ProjectFactory(owner=user, agent="demo")
    theirs = factories.ProjectFactory(owner=other_user, agent="demo")
    (Path(theirs.path) / "theirs.txt").write_text("private\n")
    session = factories.SessionFactory(project=mine)
    secrets = secrets_of_the_service(canary)
    probe = Probe.build(
        secrets=secrets,
        other_project=Path(theirs.path),
        runner_pid=runner.pid,
        outside=outside_dir,
        unmount=Path(settings.DATA_DIR) if mode == "auto" else None,
    )

    run = run_of(submit(session, f"shell {probe.script}"))
    wait_status(run, RunStatus.COMPLETED, RunStatus.FAILED, timeout=60, log=runner.log)
    assert_journal_well_formed(run)
    if mode == "none" and os.geteuid() == 0:
        # A root runner starts no agent unsandboxed (it would run as root): the turn says so.
        run.refresh_from_db()
        assert run.status == RunStatus.FAILED and "runs as root" in str(run.error), run.error
        return
    seen = Probe.results(tool_output(run))
    print(f"probe ({mode}): {seen}")
    state_dir = agent_state_dir(settings.DATA_DIR, user.pk, "demo")

    # Either way: its own project is writable, its env is clean, its HOME is the user's state.
    assert seen["project"] == "written"
    assert (Path(mine.path) / "written-by-agent.txt").read_text() == "ok\n"
    assert seen["envleak"] == "0"
    assert seen["home"] == str(state_dir)
    if mode == "none":
        # What the sandbox is for: unsandboxed, the same agent reads all of it.
        assert {seen[name] for name in secrets} == {"read"}, seen
        assert (seen["other"], seen["environ"], seen["outside"]) == ("listed", "read", "written"), seen
        assert "runs UNSANDBOXED" in runner.log()
        return
    assert {name: seen[name] for name in secrets} == dict.fromkeys(secrets, "hidden"), seen
    assert seen["other"] == "hidden" and seen["environ"] == "hidden", seen
    assert seen["unmounted"] == "hidden", seen  # no capability left to lift the tmpfs
    assert seen["outside"] == "refused" and not (outside_dir / "probe").exists()
    # Never root, even when the runner is: root reads /etc/shadow through the read-only view.
    assert seen["uid"] != "0" and seen["shadow"] == "hidden", seen
    assert int(seen["procs"]) <= 10, seen  # bwrap's init, the agent, the probe's shell and its pipes
    assert "UNSANDBOXED" not in runner.log()


@needs_bwrap
@pytest.mark.timeout(90)
@pytest.mark.django_db(transaction=True)
def test_the_sandboxed_agent_cannot_reach_the_runner_process_or_survive_it(
    runners: list[Proc], logs: Path, user: Any
) -> None:
    """Its own PID namespace: the runner is not there to signal; SIGKILL the runner, the agent goes."""
    from tests.support import ptree
    from tests.support.procs import wait_for

    runner = demo_runner(runners, logs, "auto")
    session = factories.SessionFactory(project=factories.ProjectFactory(owner=user, agent="demo"))
    run = run_of(
        submit(session, f"shell kill -0 {runner.pid} 2>/dev/null && echo runner=seen || echo runner=unseen")
    )
    wait_status(run, RunStatus.COMPLETED, RunStatus.FAILED, timeout=60, log=runner.log)
    assert Probe.results(tool_output(run))["runner"] == "unseen"
    agents = ptree.descendants(runner.pid)
    assert agents and any("runs.demo_agent" in " ".join(ptree.cmdline(pid)) for pid in agents)
    runner.kill9()
    wait_for(lambda: not any(ptree.alive(pid) for pid in agents), 10, what="the sandboxed agent to go")
