"""The homes of the npm-packaged agents, Codex and Claude: one per user, seeded from the operator's.

Design note: docs/agents.md ("Codex and Claude"). Like Hermes' HERMES_HOME, each keeps sessions,
state (Codex: an SQLite database) and settings in a directory of its own, which must be
writable and must not be shared between users: `CODEX_HOME` and `CLAUDE_CONFIG_DIR` are put in
the user's agent state directory (runs.agents.agent_state_dir) whatever the entry says, and the
operator's configuration (`$CODEX_HOME/config.toml`, `$CLAUDE_CONFIG_DIR/settings.json`; the
entry's own CODEX_HOME/CLAUDE_CONFIG_DIR, else the runner's, else ~/.codex and ~/.claude) is
copied in at every start. Codex's copy gets the keys that keep it from calling home (update
checks, analytics, feedback, apps and plugins) unless the operator set them otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from projects.pathfd import open_directory

# Commands that are these agents even when the entry names no home (the built-in entries).
CODEX_COMMANDS = frozenset({"codex-acp"})
CLAUDE_COMMANDS = frozenset({"claude-agent-acp"})
# Inside the user's state directory (the agent's HOME), where the agents look by default too.
CODEX_DIR = ".codex"
CLAUDE_DIR = ".claude"
CODEX_TMP = ".codex-tmp"

# Without these Codex looks up github.com (updates), chatgpt.com (apps, plugins) and its
# telemetry endpoints; the operator may still turn any of them on in their config.toml.
CODEX_DEFAULTS: dict[str, Any] = {
    "check_for_update_on_startup": False,
    "analytics": {"enabled": False},
    "feedback": {"enabled": False},
    "features": {
        "apps": False,
        "plugins": False,
        "remote_plugin": False,
        "plugin_discovery_prefetch": False,
        "in_app_updates": False,
        "tool_suggest": False,
    },
}
# Claude's switches for the same; the prompt suggestion is a second model call after every turn.
CLAUDE_ENV_DEFAULTS = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_ENABLE_PROMPT_SUGGESTION": "false",
}
# Claude's first mode is "auto" otherwise: a classifier model call decides its permissions;
# here the user does, as with every agent (docs/agents.md).
CLAUDE_SETTINGS_DEFAULTS: dict[str, Any] = {"permissions": {"defaultMode": "default"}}
# Codex-acp's first mode. Its default, "agent" (auto review), has the model approve commands;
# here the user does (docs/agents.md, "Codex's sandbox inside ours").
CODEX_ENV_DEFAULTS = {"INITIAL_AGENT_MODE": "workspace-write"}


@dataclass(frozen=True)
class AgentHome:
    """One npm agent's home: the variable naming it, where it is per user, what the operator keeps."""

    kind: str  # "codex" | "claude"
    variable: str  # CODEX_HOME | CLAUDE_CONFIG_DIR
    directory: str  # below the user's state directory
    shared: tuple[str, ...]  # the operator's files copied into each user's home


HOMES = {
    "codex": AgentHome("codex", "CODEX_HOME", CODEX_DIR, ("config.toml", "AGENTS.md")),
    "claude": AgentHome("claude", "CLAUDE_CONFIG_DIR", CLAUDE_DIR, ("settings.json", "CLAUDE.md")),
}


def home_of(command: str, env: Mapping[str, str]) -> AgentHome | None:
    """Which npm agent an entry starts (by its command's name, or the home its env names)."""
    name = os.path.basename(command)
    if "CODEX_HOME" in env or name in CODEX_COMMANDS:
        return HOMES["codex"]
    if "CLAUDE_CONFIG_DIR" in env or name in CLAUDE_COMMANDS:
        return HOMES["claude"]
    return None


def operator_home(home: AgentHome, env: Mapping[str, str], environ: Mapping[str, str] = os.environ) -> Path:
    """The operator's home of this agent, whose files every user's copy starts from."""
    configured = env.get(home.variable) or environ.get(home.variable)
    if configured:
        return Path(configured)
    return Path(environ.get("HOME") or Path.home()) / home.directory


def agent_home_env(home: AgentHome, env: Mapping[str, str], state_dir: Path) -> dict[str, str]:
    """What the agent's environment gets on top of the entry's: its per-user home and defaults."""
    defaults = CODEX_ENV_DEFAULTS if home.kind == "codex" else CLAUDE_ENV_DEFAULTS
    out = {key: value for key, value in defaults.items() if key not in env}
    out[home.variable] = str(state_dir / home.directory)
    if home.kind == "codex":
        # Codex puts no helper binaries under its temp dir: a CODEX_HOME below TMPDIR (a data
        # directory under /tmp, as in CI) makes every command in its sandbox fail. Its own, beside.
        out["TMPDIR"] = str(state_dir / CODEX_TMP)
    return out


def seed(
    home: AgentHome, env: Mapping[str, str], state_dir: Path, environ: Mapping[str, str] = os.environ
) -> None:
    """Make the user's home (0700) and copy the operator's files in, afresh at each start.

    Codex's config.toml is written whole even without an operator's file: the defaults above.
    """
    target = state_dir / home.directory
    target.mkdir(mode=0o700, exist_ok=True)
    if home.kind == "codex":
        (state_dir / CODEX_TMP).mkdir(mode=0o700, exist_ok=True)
    source = operator_home(home, env, environ)
    if source.resolve() == target.resolve():
        return
    # The agent can write its state directory: a symlink planted there is refused, not followed.
    fd = open_directory(target)
    try:
        for name in home.shared:
            origin = source / name
            if home.kind == "codex" and name == "config.toml":
                _write(fd, name, codex_config(origin.read_text() if origin.is_file() else ""))
            elif home.kind == "claude" and name == "settings.json":
                _write(fd, name, claude_settings(origin.read_text() if origin.is_file() else "{}"))
            elif origin.is_file():
                _write(fd, name, origin.read_text())
    finally:
        os.close(fd)


def codex_config(operator_toml: str) -> str:
    """The operator's config.toml with CODEX_DEFAULTS under it (the operator's keys win)."""
    merged = _merged(CODEX_DEFAULTS, tomllib.loads(operator_toml))
    return dump_toml(merged)


def claude_settings(operator_json: str) -> str:
    """The operator's settings.json with CLAUDE_SETTINGS_DEFAULTS under it (the operator's keys win)."""
    loaded = json.loads(operator_json or "{}")
    if not isinstance(loaded, dict):
        raise ValueError("Claude's settings.json must hold a JSON object")
    return json.dumps(_merged(CLAUDE_SETTINGS_DEFAULTS, loaded), indent=2) + "\n"


def _merged(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def dump_toml(data: Mapping[str, Any], prefix: str = "") -> str:
    """TOML for what tomllib reads from a config: scalars, arrays, nested tables (no dates)."""
    lines = [f"{_key(key)} = {_value(value)}" for key, value in data.items() if not _is_table(value)]
    for key, value in data.items():
        if _is_table(value):
            name = f"{prefix}{_key(key)}"
            body = dump_toml(value, f"{name}.")
            lines += ["", f"[{name}]", body] if body else ["", f"[{name}]"]
    return "\n".join(line for line in lines).strip("\n") + ("\n" if not prefix else "")


def _is_table(value: Any) -> bool:
    return isinstance(value, dict)


def _key(key: str) -> str:
    bare = key and all(c.isalnum() or c in "-_" for c in key) and key.isascii()
    return key if bare else json.dumps(key, ensure_ascii=False)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + "}"
    raise ValueError(f"cannot write {type(value).__name__} in a Codex config")


def _write(directory: int, name: str, text: str) -> None:
    """Whole (a temp file renamed), 0600: the agent may have rewritten it since the last start."""
    temp = f".{name}.seed"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temp, dir_fd=directory)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    with os.fdopen(os.open(temp, flags, 0o600, dir_fd=directory), "w") as out:
        out.write(text)
    os.replace(temp, name, src_dir_fd=directory, dst_dir_fd=directory)


def prepare_home(
    command: str, env: Mapping[str, str], state_dir: Path, environ: Mapping[str, str] = os.environ
) -> Path | None:
    """Seed the user's home if the entry is Codex or Claude; the operator's home to hide, if any.

    The operator's own sessions and credentials stay out of the sandbox: only the copies are in.
    """
    home = home_of(command, env)
    if home is None:
        return None
    seed(home, env, state_dir, environ)
    source = operator_home(home, env, environ).resolve()
    return source if source.is_dir() and not Path(command).resolve().is_relative_to(source) else None


def builtin_entries(base_dir: Path, environ: Mapping[str, str] = os.environ) -> dict[str, dict[str, Any]]:
    """The built-in `codex` and `claude` entries: bin/setup-agents' install in agents/node_modules.

    No provider is configured here: the operator's config.toml (Codex) and the entry's env
    (Claude: ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL) say which model serves them (README).
    """
    installed = base_dir / "agents" / "node_modules" / ".bin"
    return {
        "codex": {
            "command": environ.get("HERMESWEB_CODEX_COMMAND", str(installed / "codex-acp")),
            "args": [],
            "env": {},
        },
        "claude": {
            "command": environ.get("HERMESWEB_CLAUDE_COMMAND", str(installed / "claude-agent-acp")),
            "args": [],
            "env": {},
        },
    }
