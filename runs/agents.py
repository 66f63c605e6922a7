"""The operator's agent registry: agent name → how to start it.

Agents are configured by the operator (environment or a TOML file), never
through the API, because an agent entry is a command line the runner executes.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured


@dataclass(frozen=True)
class AgentSpec:
    name: str
    command: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    # Hermes reports a running session total in PromptResponse.usage; the runner
    # stores per-turn usage as the difference when this is set.
    cumulative_usage: bool = False
    # How steer reaches the agent: "slash" (a `/steer text` prompt mid-turn),
    # "extension" (`_session/steering`), "auto" (detected: detected_steer), "none".
    steer: str = "auto"

    def resolved_command(self) -> str | None:
        if os.path.isabs(self.command):
            return self.command if os.access(self.command, os.X_OK) else None
        return shutil.which(self.command)


# Agents that take `/steer <text>` mid-turn though their initialize does not say so.
SLASH_STEER_AGENTS = frozenset({"hermes-agent"})


def detected_steer(agent_name: str | None, meta: dict[str, Any], command_names: Iterable[str] = ()) -> str:
    """How an agent configured with `steer = "auto"` takes steer, from what it told us (docs/agents.md).

    The signals: initialize's `_meta` (`steer: "slash"`, or a `session/steering` extension),
    `agentInfo.name` (Hermes names itself `hermes-agent`), and a `steer` command among the
    session's `available_commands_update`. "none" when none of them says so.
    """
    if meta.get("steer") == "slash" or agent_name in SLASH_STEER_AGENTS or "steer" in set(command_names):
        return "slash"
    if "_session/steering" in meta or "session/steering" in meta:
        return "extension"
    return "none"


def builtin_agents(data_dir: Path) -> dict[str, dict[str, Any]]:
    return {
        "demo": {
            "command": sys.executable,
            "args": ["-m", "runs.demo_agent", "--home", str(data_dir / "demo-agent")],
            # The agent runs with the project as cwd; it must still find its own package.
            "env": {
                "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
                "HERMESWEB_DEMO_DELAY": os.environ.get("HERMESWEB_DEMO_DELAY", "0.02"),
                "HERMESWEB_DEMO_STEER": os.environ.get("HERMESWEB_DEMO_STEER", "slash"),
            },
            # "/steer" by default; `_session/steering` when HERMESWEB_DEMO_STEER=extension.
            "steer": "extension" if os.environ.get("HERMESWEB_DEMO_STEER") == "extension" else "slash",
        },
        "hermes": {
            "command": os.environ.get("HERMESWEB_HERMES_COMMAND", "hermes-acp"),
            "args": [],
            "env": {},
            "cumulative_usage": True,
            "steer": "slash",
        },
    }


def _spec(name: str, raw: Any, source: str) -> AgentSpec:
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(f"{source}: agent {name!r} must be a table/object")
    command = raw.get("command")
    if not isinstance(command, str) or not command:
        raise ImproperlyConfigured(f"{source}: agent {name!r} needs a non-empty string 'command'")
    args = raw.get("args", [])
    env = raw.get("env", {})
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ImproperlyConfigured(f"{source}: agent {name!r} 'args' must be a list of strings")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ImproperlyConfigured(f"{source}: agent {name!r} 'env' must map strings to strings")
    steer = raw.get("steer", "auto")
    if steer not in {"auto", "slash", "extension", "none"}:
        raise ImproperlyConfigured(f"{source}: agent {name!r} 'steer' must be auto|slash|extension|none")
    return AgentSpec(
        name=name,
        command=command,
        args=list(args),
        env=dict(env),
        cumulative_usage=bool(raw.get("cumulative_usage", False)),
        steer=steer,
    )


def load_agents(
    data_dir: Path, environ: dict[str, str] | os._Environ[str] = os.environ
) -> dict[str, AgentSpec]:
    """Built-ins, then HERMESWEB_AGENTS_FILE (TOML), then HERMESWEB_AGENTS (JSON) override by name."""
    merged: dict[str, tuple[Any, str]] = {
        name: (raw, "built-in") for name, raw in builtin_agents(data_dir).items()
    }
    file_name = environ.get("HERMESWEB_AGENTS_FILE")
    if file_name:
        try:
            data = tomllib.loads(Path(file_name).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ImproperlyConfigured(f"HERMESWEB_AGENTS_FILE: cannot read {file_name!r}: {exc}") from None
        table = data.get("agents", data)
        if not isinstance(table, dict):
            raise ImproperlyConfigured("HERMESWEB_AGENTS_FILE: expected an [agents] table")
        merged.update({name: (raw, "HERMESWEB_AGENTS_FILE") for name, raw in table.items()})
    raw_json = environ.get("HERMESWEB_AGENTS")
    if raw_json:
        try:
            data = json.loads(raw_json)
        except json.JSONDecodeError as exc:
            raise ImproperlyConfigured(f"HERMESWEB_AGENTS must be a JSON object: {exc}") from None
        if not isinstance(data, dict):
            raise ImproperlyConfigured(
                "HERMESWEB_AGENTS must be a JSON object of name → {command, args, env}"
            )
        merged.update({name: (raw, "HERMESWEB_AGENTS") for name, raw in data.items()})
    return {name: _spec(name, raw, source) for name, (raw, source) in merged.items()}


def get_agent(name: str) -> AgentSpec:
    from django.conf import settings

    return settings.HERMESWEB_AGENTS[name]
