"""Agent processes in bubblewrap: what an agent can see and touch of the machine.

Design note: docs/security.md ("The agent sandbox"). An agent runs tools a model chose, as the
service's OS user; without a sandbox it could read the database, `secret_key`, other users'
projects and `/proc/<runner>/environ`. `bwrap_argv` (pure, unit-tested) says what an agent is
given; `prepare` decides per agent and host whether it applies and builds the command line, the
environment and the user's state directory.

What an agent gets in the sandbox:
- its own PID namespace and a fresh /proc: no other process of the host is visible;
- the whole filesystem read-only, with a private /tmp and /run (the host's unix sockets:
  a PostgreSQL trusting local peers, Redis), and tmpfs over the data directory, every
  allowed root and the operator's own files (`hide`);
- its project and its user's state directory writable, nothing else;
- the network as it is: the agent reaches its model server, on loopback too;
- only the environment `agent_env` builds, handed to bwrap as its own environment (never
  as `--setenv`, which would show values in the host's process list).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from runs import agents
from runs.agents import DEBIAN_BWRAP, AgentSpec

# Variables of the runner's environment an agent gets; everything else (DATABASE_URL,
# SECRET_KEY, REDIS_URL …) stays with the runner. The agent entry's own `env` comes on top.
PASSED_ENV = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "TERM", "SHELL", "USER", "LOGNAME")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
# Files of the operator's Hermes home every user's Hermes reads (model, provider, approvals;
# API keys); the rest of a Hermes home — sessions, memories, skills, logs — is per user.
HERMES_SHARED_FILES = ("config.yaml", ".env")
# The documented place of the service's environment file (DATABASE_URL, SECRET_KEY:
# docs/deploy.md), readable by the service's user and so by its agents unless hidden.
DEFAULT_HIDDEN = ("/etc/hermesweb",)


class SandboxUnavailable(Exception):
    """An agent that requires the sandbox (`sandbox = "required"`) on a host where bwrap does not work."""


@dataclass(frozen=True)
class Launch:
    """How to start one agent process."""

    command: str
    args: list[str]
    env: dict[str, str]
    sandboxed: bool
    # Why it is not sandboxed ("" when it is).
    unsandboxed_because: str = ""


def bwrap_argv(
    spec: AgentSpec,
    command: str,
    *,
    project: Path,
    state_dir: Path,
    data_dir: Path,
    roots: Sequence[Path],
    hide: Sequence[Path] = (),
    mask: Sequence[Path] = (),
    keep: Sequence[Path] = (),
    read_only: Sequence[tuple[Path, Path]] = (),
    project_aliases: Sequence[Path] = (),
    code: Sequence[Path] = (),
    bwrap: str = DEBIAN_BWRAP,
) -> list[str]:
    """The argv that runs `command` (with the spec's args) in bubblewrap. Pure: no filesystem access.

    `project` and `state_dir` are bound writable; `data_dir`, `roots` and the directories in
    `hide` are covered with an empty tmpfs (after /tmp and /run, and after `code` — the agent's
    installation and the product's code, which may live under /tmp — is bound back read-only
    over those two), the files in `mask` with
    /dev/null. `keep` are bound back read-only after hiding (the resolver's directory under
    /run, Hermes' code in the operator's hidden home); `read_only` binds (source,
    destination) files read-only into the state directory. Order matters to bwrap: every
    mount covers the ones before it, so hiding comes first and the binds of what the agent
    may use come last, on top.
    """
    argv = [
        bwrap,
        "--die-with-parent",  # the runner gone (even SIGKILLed), the agent goes too
        "--unshare-pid",
        "--unshare-ipc",
        "--new-session",  # no TIOCSTI into the runner's terminal
        # A service run as root keeps every capability in bwrap otherwise: enough to unmount
        # the tmpfs over the data directory and read what it hides.
        "--cap-drop",
        "ALL",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",  # a fresh /proc: only the sandbox's own processes
    ]
    for path in (Path("/tmp"), Path("/run")):
        argv += ["--tmpfs", str(path)]
    for path in code:
        argv += ["--ro-bind-try", str(path), str(path)]
    for path in _outermost([data_dir, *roots, *hide]):
        argv += ["--tmpfs", str(path)]
    for path in keep:
        argv += ["--ro-bind-try", str(path), str(path)]
    for path in mask:
        argv += ["--ro-bind", "/dev/null", str(path)]
    for path in (project, *(p for p in project_aliases if p != project)):
        argv += ["--bind", str(project), str(path)]
    argv += ["--bind", str(state_dir), str(state_dir)]
    for source, destination in read_only:
        argv += ["--ro-bind", str(source), str(destination)]
    argv += ["--chdir", str(project), "--", command, *spec.args]
    return argv


def _outermost(paths: Iterable[Path]) -> list[Path]:
    """`paths` without those inside another one (already hidden), parents first."""
    chosen: list[Path] = []
    for path in sorted({Path(p) for p in paths}, key=lambda p: (len(p.parts), str(p))):
        if path == Path("/"):
            continue  # hiding / would hide the agent's own command
        if not any(path.is_relative_to(parent) for parent in chosen):
            chosen.append(path)
    return chosen


def agent_env(
    spec: AgentSpec, state_dir: Path, *, sandboxed: bool, environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """The agent's whole environment: a few of the runner's variables, the entry's env, its state.

    HOME (and HERMES_HOME for Hermes) is the user's state directory whatever the entry says:
    an entry's own HOME or HERMES_HOME would be shared by every user.
    """
    env = {key: environ[key] for key in PASSED_ENV if environ.get(key)}
    env.setdefault("PATH", DEFAULT_PATH)
    if not sandboxed and environ.get("TMPDIR"):
        env["TMPDIR"] = environ["TMPDIR"]
    env.update(spec.env)
    env["HOME"] = str(state_dir)
    if spec.is_hermes:
        env["HERMES_HOME"] = str(state_dir)
    if sandboxed:
        env["TMPDIR"] = "/tmp"  # the sandbox's own tmpfs
    return env


# ---------------------------------------------------------------- one agent's launch


def hidden_paths(environ: Mapping[str, str] = os.environ) -> list[Path]:
    """The operator's files hidden from agents besides the data directory and the roots.

    HERMESWEB_SANDBOX_HIDE (comma-separated absolute paths) replaces the default, the
    deploy's /etc/hermesweb; HERMESWEB_AGENTS_FILE is always hidden (entries may hold keys).
    A relative path is a ValueError: silently hiding less than the operator asked is worse.
    """
    raw = environ.get("HERMESWEB_SANDBOX_HIDE")
    names = [p.strip() for p in raw.split(",") if p.strip()] if raw is not None else list(DEFAULT_HIDDEN)
    for name in names:
        if not os.path.isabs(name):
            raise ValueError(f"HERMESWEB_SANDBOX_HIDE: {name!r} is not an absolute path")
    paths = [Path(name) for name in names]
    if environ.get("HERMESWEB_AGENTS_FILE"):
        paths.append(Path(environ["HERMESWEB_AGENTS_FILE"]))
    return paths


def prepare(
    spec: AgentSpec,
    command: str,
    *,
    cwd: str,
    project: Path,
    state_dir: Path,
    data_dir: Path,
    roots: Sequence[Path],
    environ: Mapping[str, str] = os.environ,
) -> Launch:
    """Make the user's state directory and say how to start the agent (in bwrap when it applies).

    Raises SandboxUnavailable for an agent that requires the sandbox where it does not work,
    ValueError for a bad HERMESWEB_SANDBOX_HIDE.
    """
    use, why = agents.sandboxed(spec)
    if not use and spec.sandbox == "required":
        raise SandboxUnavailable(f"agent {spec.name!r} requires the sandbox, and {why}")
    _make_private_dirs(state_dir, stop_at=data_dir)
    shared = _hermes_shared_files(spec, state_dir, environ) if spec.is_hermes else []
    env = agent_env(spec, state_dir, sandboxed=use, environ=environ)
    if not use:
        for source, destination in shared:
            _copy_private(source, destination)  # no bind outside the sandbox: a fresh copy each start
        return Launch(command, list(spec.args), env, sandboxed=False, unsandboxed_because=why)
    hide, mask = [], []
    keep = _resolver_dirs()
    for path in hidden_paths(environ):
        (hide if path.is_dir() else mask if path.exists() else []).append(path)
    if spec.is_hermes:
        # The operator's own Hermes sessions and memories; only the shared files are bound in.
        home = spec.operator_hermes_home(environ).resolve()
        if home.is_dir():
            hide.append(home)
            installed = Path(command).resolve()
            if installed.is_relative_to(home):
                # Hermes' installer puts the code in ~/.hermes/hermes-agent: that stays readable.
                keep.append(home / installed.relative_to(home).parts[0])
    aliases = [Path(cwd)] if os.path.normpath(cwd) != str(project) else []
    argv = bwrap_argv(
        spec,
        command,
        project=project,
        state_dir=state_dir.resolve(),
        data_dir=data_dir.resolve(),
        roots=[Path(r).resolve() for r in roots],
        hide=hide,
        mask=mask,
        keep=keep,
        read_only=shared,
        project_aliases=aliases,
        code=code_dirs(command),
        bwrap=agents.bwrap().path or DEBIAN_BWRAP,
    )
    return Launch(argv[0], argv[1:], env, sandboxed=True)


def code_dirs(command: str) -> list[Path]:
    """What the agent runs from: its command's installation (a virtualenv's root) and this
    product's code (the demo agent is `python -m runs.demo_agent`); either may sit under /tmp."""
    dirs = [Path(settings.BASE_DIR).resolve()]
    path = Path(command)
    if path.is_absolute() and path.parent.name == "bin":
        dirs.append(path.parent.parent)  # not resolved: a venv's python links out of the venv
    return dirs


def _hermes_shared_files(
    spec: AgentSpec, state_dir: Path, environ: Mapping[str, str]
) -> list[tuple[Path, Path]]:
    home = spec.operator_hermes_home(environ)
    return [(home / name, state_dir / name) for name in HERMES_SHARED_FILES if (home / name).is_file()]


def _resolver_dirs() -> list[Path]:
    """/etc/resolv.conf's directory when it lives under /run (systemd-resolved, resolvconf)."""
    target = Path("/etc/resolv.conf").resolve()
    return [target.parent] if target.is_relative_to("/run") and target.exists() else []


def _make_private_dirs(path: Path, *, stop_at: Path) -> None:
    """mkdir -p, with mode 0700 for each directory made below `stop_at` (other users' state)."""
    missing = []
    current = path
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        private = directory != stop_at and directory.is_relative_to(stop_at)
        with contextlib.suppress(FileExistsError):  # another runner made it meanwhile
            directory.mkdir(mode=0o700 if private else 0o777)


def _copy_private(source: Path, destination: Path) -> None:
    """Replace `destination` with a 0600 copy of `source`, whole (a temp file renamed)."""
    fd, temp = tempfile.mkstemp(dir=destination.parent, prefix=f".{destination.name}.")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(source.read_bytes())
        os.replace(temp, destination)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
