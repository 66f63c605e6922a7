"""Codex's and Claude's per-user homes (runs/agent_homes.py): what each user's agent starts with.

The agents themselves, offline through the runner: tests/test_codex_and_claude.py.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest

from projects.pathfd import UnsafePath
from runs import agent_homes
from runs.agents import AgentSpec, load_agents
from runs.runner.sandbox import Bound, agent_env, bwrap_argv


def codex(env: dict[str, str] | None = None) -> AgentSpec:
    return AgentSpec(name="codex", command="/opt/agents/.bin/codex-acp", env=env or {})


def claude(env: dict[str, str] | None = None) -> AgentSpec:
    return AgentSpec(name="claude", command="/opt/agents/.bin/claude-agent-acp", env=env or {})


def test_the_builtin_entries_start_what_bin_setup_agents_installs(tmp_path: Path) -> None:
    specs = load_agents(tmp_path, {})
    root = Path(__file__).resolve().parents[1] / "agents" / "node_modules" / ".bin"
    assert specs["codex"].command == str(root / "codex-acp")
    assert specs["claude"].command == str(root / "claude-agent-acp")


def test_each_user_gets_a_codex_home_of_their_own_whatever_the_entry_names(tmp_path: Path) -> None:
    state = tmp_path / "agents" / "7" / "codex"
    spec = codex({"CODEX_HOME": "/srv/operator/.codex", "K": "v"})
    env = agent_env(spec, state, sandboxed=True, environ={})
    assert env["CODEX_HOME"] == str(state / ".codex")
    assert env["HOME"] == str(state) and env["K"] == "v"
    # Codex refuses helper binaries below its temp dir: never an ancestor of CODEX_HOME.
    assert not Path(env["CODEX_HOME"]).is_relative_to(env["TMPDIR"])
    assert env["INITIAL_AGENT_MODE"] == "workspace-write"  # the user answers, not a model
    chosen = agent_env(codex({"INITIAL_AGENT_MODE": "read-only"}), state, sandboxed=True, environ={})
    assert chosen["INITIAL_AGENT_MODE"] == "read-only"


def test_claude_gets_its_config_dir_per_user_and_no_nonessential_traffic(tmp_path: Path) -> None:
    state = tmp_path / "agents" / "7" / "claude"
    spec = claude({"CLAUDE_CONFIG_DIR": "/srv/operator/.claude", "DISABLE_TELEMETRY": "0"})
    env = agent_env(spec, state, sandboxed=True, environ={})
    assert env["CLAUDE_CONFIG_DIR"] == str(state / ".claude")
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["DISABLE_AUTOUPDATER"] == env["DISABLE_ERROR_REPORTING"] == "1"
    assert env["DISABLE_TELEMETRY"] == "0"  # the operator's explicit choice stays
    assert "CODEX_HOME" not in env


def test_other_agents_get_neither_home(tmp_path: Path) -> None:
    env = agent_env(AgentSpec(name="x", command="/usr/bin/x"), tmp_path, sandboxed=True, environ={})
    assert not {"CODEX_HOME", "CLAUDE_CONFIG_DIR", "INITIAL_AGENT_MODE"} & set(env)


def test_the_operators_codex_config_is_seeded_with_the_quiet_defaults_under_it(tmp_path: Path) -> None:
    operator = tmp_path / "operator"
    operator.mkdir()
    (operator / "config.toml").write_text(
        'model = "m"\nmodel_provider = "p"\n[model_providers.p]\nbase_url = "http://10.0.0.5:8080/v1"\n'
        'wire_api = "responses"\nenv_key = "P_KEY"\n[features]\napps = true\n'
        '[projects."/srv/a b"]\ntrust_level = "trusted"\n'
    )
    (operator / "AGENTS.md").write_text("Be brief.\n")
    (operator / "auth.json").write_text('{"token": "the operator\'s"}')
    state = tmp_path / "state"
    state.mkdir()
    spec = codex({"CODEX_HOME": str(operator)})
    hidden = agent_homes.prepare_home(spec.command, spec.env, state)
    assert hidden == operator.resolve()  # the operator's own home is hidden from the sandbox
    config = tomllib.loads((state / ".codex" / "config.toml").read_text())
    assert config["model_providers"]["p"]["base_url"] == "http://10.0.0.5:8080/v1"
    assert config["check_for_update_on_startup"] is False
    assert config["analytics"] == {"enabled": False} and config["feedback"] == {"enabled": False}
    assert config["features"]["apps"] is True  # the operator's key wins
    assert config["features"]["plugins"] is False and config["features"]["in_app_updates"] is False
    assert config["projects"]["/srv/a b"] == {"trust_level": "trusted"}
    assert (state / ".codex" / "AGENTS.md").read_text() == "Be brief.\n"
    assert not (state / ".codex" / "auth.json").exists()  # credentials: the entry's env, not copies
    assert (state / ".codex").stat().st_mode & 0o777 == 0o700
    assert (state / ".codex" / "config.toml").stat().st_mode & 0o777 == 0o600


def test_without_an_operators_config_codex_still_gets_the_defaults(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    spec = codex({"CODEX_HOME": str(tmp_path / "none")})
    assert agent_homes.prepare_home(spec.command, spec.env, state) is None
    config = tomllib.loads((state / ".codex" / "config.toml").read_text())
    assert config["check_for_update_on_startup"] is False


def test_claude_starts_in_manual_mode_unless_the_operator_says_otherwise(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    operator = tmp_path / "operator"
    operator.mkdir()
    spec = claude({"CLAUDE_CONFIG_DIR": str(operator)})
    agent_homes.prepare_home(spec.command, spec.env, state)
    settings = json.loads((state / ".claude" / "settings.json").read_text())
    assert settings == {"permissions": {"defaultMode": "default"}}
    (operator / "settings.json").write_text('{"permissions": {"defaultMode": "acceptEdits"}, "x": 1}')
    agent_homes.prepare_home(spec.command, spec.env, state)
    settings = json.loads((state / ".claude" / "settings.json").read_text())
    assert settings == {"permissions": {"defaultMode": "acceptEdits"}, "x": 1}


def test_a_symlink_the_agent_planted_for_its_home_is_refused_not_followed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, state / ".codex")
    with pytest.raises(UnsafePath):
        agent_homes.prepare_home(codex().command, {"CODEX_HOME": str(tmp_path / "op")}, state)
    assert list(elsewhere.iterdir()) == []


def test_the_sandboxs_tmp_is_writable_by_the_agent_account() -> None:
    # Claude makes /tmp/claude-<uid>, Codex its sockets: a root-owned 0755 tmpfs failed both.
    argv = bwrap_argv(
        codex(),
        "/opt/agents/.bin/codex-acp",
        project=Bound(5, Path("/srv/p")),
        state_dir=Bound(6, Path("/srv/data/agents/1/codex")),
        data_dir=Path("/srv/data"),
        roots=[],
    )
    at = argv.index("/tmp", argv.index("--tmpfs") - 0)
    assert argv[at - 3 : at + 1] == ["--perms", "1777", "--tmpfs", "/tmp"]
