"""The operator's agent registry: agent name → how to start it.

Agents are configured by the operator (environment or a TOML file), never
through the API, because an agent entry is a command line the runner executes.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from runs import agent_homes
from runs.labels import LabelError, parse_labels


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
    # Where the agent runs (runs/runner/sandbox.py): "auto" in bubblewrap when bwrap works on
    # this host, else unsandboxed with a warning; "required" bubblewrap or no start; "none" never.
    sandbox: str = "auto"
    # What the sandboxed agent may reach (runs/runner/netpolicy.py): None (no key) public
    # addresses only; "all" the host's network, unfiltered (unsafe); else the listed
    # "host[:port]" entries only, () being no network at all.
    network: str | tuple[str, ...] | None = None
    # Runner labels its turns need (runs.placement), besides their project's: ("gpu",).
    labels: tuple[str, ...] = ()

    def resolved_command(self) -> str | None:
        if os.path.isabs(self.command):
            return self.command if os.access(self.command, os.X_OK) else None
        return shutil.which(self.command)

    @property
    def is_hermes(self) -> bool:
        """Hermes keeps its sessions, memories and config under HERMES_HOME (per user: agent_state_dir)."""
        return "HERMES_HOME" in self.env or os.path.basename(self.command) in HERMES_COMMANDS

    def operator_hermes_home(self, environ: Mapping[str, str] = os.environ) -> Path:
        """The operator's Hermes home, whose config.yaml (and .env) every user's Hermes reads."""
        configured = self.env.get("HERMES_HOME") or environ.get("HERMES_HOME")
        return Path(configured) if configured else Path(environ.get("HOME") or Path.home()) / ".hermes"


# Commands that are Hermes even when the operator set no HERMES_HOME (the built-in entry).
HERMES_COMMANDS = frozenset({"hermes-acp", "hermes"})
SANDBOX_MODES = ("auto", "required", "none")
NETWORK_ALL = "all"
# One DNS label of an agent's `network` entry (ASCII: an IDN is written in its punycode form).
_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_HOST_NAME = re.compile(rf"(?:\*\.)?(?:{_LABEL}\.)*{_LABEL}", re.ASCII)


def parse_network_entry(entry: object) -> tuple[str, int | None]:
    """One `network` entry, `host[:port]`, as (host, port or None); ValueError saying what is wrong.

    The host is a lowercase name (`*.example.com`: any name below example.com), an IPv4 address
    or an IPv6 address in brackets (`[::1]:8765`), written canonically.
    """
    if not isinstance(entry, str) or not entry:
        raise ValueError(f'{entry!r} is not a "host[:port]" string')
    host, port_text, bracketed = entry, None, entry.startswith("[")
    if bracketed:
        host, closed, rest = entry[1:].partition("]")
        if not closed or rest[:1] not in ("", ":"):
            raise ValueError(f"{entry!r}: write an IPv6 address as [address] or [address]:port")
        port_text = rest[1:] if rest else None
    elif entry.count(":") > 1:
        # `::1:8765` is itself an address: without brackets the port cannot be told apart.
        raise ValueError(f"{entry!r}: write an IPv6 address as [address] or [address]:port")
    elif ":" in entry:
        host, port_text = entry.split(":")
    port = None
    if port_text is not None:
        if not re.fullmatch(r"[0-9]{1,5}", port_text, re.ASCII) or not 1 <= int(port_text) <= 65535:
            raise ValueError(f"{entry!r}: the port must be a number from 1 to 65535")
        port = int(port_text)
    try:
        address = ipaddress.IPv6Address(host) if bracketed else ipaddress.IPv4Address(host)
        return str(address), port
    except ValueError:
        if bracketed:
            raise ValueError(f"{entry!r}: [{host}] is not an IPv6 address") from None
    host = host.lower().removesuffix(".")
    # A last label of digits is no name: resolvers read `127.1` or `10.1` as an address.
    if len(host) > 253 or not _HOST_NAME.fullmatch(host) or host.rsplit(".", 1)[-1].isdigit():
        raise ValueError(
            f"{entry!r} is not a host name, `*.domain`, IPv4 address or [IPv6 address]"
            + (' (for every host, network = "all")' if host == "*" else "")
        )
    return host, port


def agent_state_dir(data_dir: Path, owner_id: int, agent_name: str) -> Path:
    """Where one user's sessions of one agent live: the agent's HOME (and HERMES_HOME for Hermes).

    A project has one owner, so the runner derives it from the project; two users never share
    an agent session store, so discovery and import only ever reach the user's own sessions.
    """
    # Agent names come from the operator; still, a name must stay one path component.
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", agent_name).lstrip(".") or "_"
    return Path(data_dir) / "agents" / str(int(owner_id)) / safe


# Agents that take `/steer <text>` mid-turn though their initialize does not say so.
SLASH_STEER_AGENTS = frozenset({"hermes-agent"})


def detected_steer(agent_name: str | None, meta: dict[str, Any], command_names: Iterable[str] = ()) -> str:
    """How an agent configured with `steer = "auto"` takes steer, from what it told us (docs/agents.md).

    The signals: initialize's `_meta` (`steer: "slash"`, a `session/steering` extension, or
    `steering.supported`),
    `agentInfo.name` (Hermes names itself `hermes-agent`), and a `steer` command among the
    session's `available_commands_update`. "none" when none of them says so.
    """
    if meta.get("steer") == "slash" or agent_name in SLASH_STEER_AGENTS or "steer" in set(command_names):
        return "slash"
    steering = meta.get("steering")
    # codex-acp and claude-agent-acp: `_meta.steering.supported`, the ACP steering extension's flag.
    if "_session/steering" in meta or "session/steering" in meta:
        return "extension"
    if isinstance(steering, dict) and steering.get("supported") is True:
        return "extension"
    return "none"


def builtin_agents(data_dir: Path | None = None) -> dict[str, dict[str, Any]]:
    """The built-in entries. `data_dir` is no longer read: agents keep their state per user."""
    return {
        "demo": {
            "command": sys.executable,
            # No --home: the agent keeps its sessions under $HOME, the user's state directory.
            "args": ["-m", "runs.demo_agent"],
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
        # Codex and Claude (bin/setup-agents; runs/agent_homes.py: their per-user homes).
        **agent_homes.builtin_entries(Path(__file__).resolve().parent.parent),
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
    sandbox = raw.get("sandbox", "auto")
    if sandbox not in SANDBOX_MODES:
        raise ImproperlyConfigured(f"{source}: agent {name!r} 'sandbox' must be {'|'.join(SANDBOX_MODES)}")
    network = raw.get("network")
    if network is not None and network != NETWORK_ALL:
        if not isinstance(network, list):
            raise ImproperlyConfigured(
                f'{source}: agent {name!r} \'network\' must be "all" or a list of "host[:port]" '
                f"strings ([] for no network; leave it out for public addresses only), got {network!r}"
            )
        for entry in network:
            try:
                parse_network_entry(entry)
            except ValueError as exc:
                raise ImproperlyConfigured(f"{source}: agent {name!r} 'network': {exc}") from None
        network = tuple(network)
    return AgentSpec(
        name=name,
        command=command,
        args=list(args),
        env=dict(env),
        cumulative_usage=bool(raw.get("cumulative_usage", False)),
        steer=steer,
        sandbox=sandbox,
        network=network,
        labels=_labels(name, raw.get("labels", []), source),
    )


def _labels(name: str, raw: Any, source: str) -> tuple[str, ...]:
    try:
        return parse_labels(raw)
    except LabelError as exc:
        raise ImproperlyConfigured(f"{source}: agent {name!r} 'labels': {exc}") from None


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
                "HERMESWEB_AGENTS must be a JSON object of name → {command, args, env, …}"
            )
        merged.update({name: (raw, "HERMESWEB_AGENTS") for name, raw in data.items()})
    return {name: _spec(name, raw, source) for name, (raw, source) in merged.items()}


# ---------------------------------------------------------------- the agent sandbox on this host
# Whether agents run in bubblewrap here (runs/runner/sandbox.py builds the command line); read by
# the runner, doctor and /api/health (docs/security.md, "The agent sandbox").

DEBIAN_BWRAP = "/usr/bin/bwrap"


@dataclass(frozen=True)
class Bwrap:
    """bubblewrap on this host: its path when it works, else why not."""

    path: str | None
    version: str = ""
    problem: str = ""


@functools.cache
def bwrap() -> Bwrap:
    """bubblewrap here, tried once per process: installed is not enough (user namespaces may be off)."""
    path = shutil.which("bwrap") or (DEBIAN_BWRAP if os.access(DEBIAN_BWRAP, os.X_OK) else None)
    if path is None:
        return Bwrap(None, problem="bubblewrap (bwrap) is not installed")
    probe = [path, "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--new-session", "--cap-drop"]
    probe += [
        "ALL",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--tmpfs",
        "/tmp",
        "--",
        "true",
    ]
    try:
        version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
        tried = subprocess.run(probe, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return Bwrap(None, problem=f"{path} cannot be run: {exc}")
    if tried.returncode != 0:
        return Bwrap(None, problem=f"{path} does not work on this host: {tried.stderr.strip()[:300]}")
    return Bwrap(path, version=version.strip())


def sandboxed(spec: AgentSpec) -> tuple[bool, str]:
    """Whether `spec`'s agents run in bubblewrap on this host, and if not, why."""
    if spec.sandbox == "none":
        return False, 'its entry says sandbox = "none"'
    found = bwrap()
    if found.path is None:
        return False, found.problem
    return True, ""


def sandbox_warnings(specs: Iterable[AgentSpec]) -> list[str]:
    """What doctor and /api/health say about agents that run (or would run) unsandboxed here."""
    out = []
    for spec in specs:
        ok, why = sandboxed(spec)
        if ok:
            continue
        if spec.sandbox == "required":
            out.append(f"agent {spec.name!r} cannot start: it requires the sandbox and {why}")
        else:
            out.append(f"agent {spec.name!r} runs unsandboxed: {why}")
    return out


def get_agent(name: str) -> AgentSpec:
    from django.conf import settings

    return settings.HERMESWEB_AGENTS[name]
