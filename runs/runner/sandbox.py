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
- a network namespace of its own: only what its entry's `network` lets it reach, through the
  runner's filtering proxy (netproxy.py) relayed by netbridge.py; by default public addresses;
- never root: a root runner starts it as an unprivileged account (account.py);
- only the environment `agent_env` builds, handed to bwrap as its own environment (never
  as `--setenv`, which would show values in the host's process list).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from projects.pathfd import give_tree, open_directory, open_file
from runs import agent_homes, agents
from runs.agents import DEBIAN_BWRAP, AgentSpec
from runs.runner.account import AgentAccount, agent_account
from runs.runner.netbridge import bridge_argv, proxy_env
from runs.runner.netpolicy import NetworkPolicy, policy_for
from worktrees.trees import AgentTree

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
    # Descriptors bwrap binds (`--bind-fd`): passed to the child, closed by the caller after the spawn.
    fds: tuple[int, ...] = ()

    def close_fds(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)


@dataclass(frozen=True)
class Bound:
    """A descriptor opened without following symlinks (pathfd), and where the sandbox shows it."""

    fd: int
    destination: Path


@dataclass(frozen=True)
class NetworkPlan:
    """The sandbox's network: its own namespace (every agent entry but `network = "all"`), and
    the directory of the runner's filtering proxy socket, bound in, when the agent may go out."""

    unshare: bool
    proxy_dir: Bound | None = None


# The proxy's socket in the directory the runner binds into the sandbox (runs/runner/netproxy.py).
PROXY_SOCKET = "proxy.sock"

# Inside bwrap a root runner's agent starts as root with just these capabilities: enough to
# enter the project the agent account owns (bwrap's --chdir) and for setpriv to become that
# account and drop them all (no_new_privs: no setuid binary lifts it again).
SETPRIV = "/usr/bin/setpriv"
ROOT_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP", "CAP_DAC_READ_SEARCH")


def bwrap_argv(
    spec: AgentSpec,
    command: str,
    *,
    project: Bound,
    state_dir: Bound,
    data_dir: Path,
    roots: Sequence[Path],
    hide: Sequence[Path] = (),
    mask: Sequence[Path] = (),
    keep: Sequence[Path] = (),
    read_only: Sequence[Bound] = (),
    git: Sequence[tuple[Bound, bool]] = (),
    project_aliases: Sequence[Path] = (),
    code: Sequence[Path] = (),
    run_as: AgentAccount | None = None,
    home: Path | None = None,
    network: NetworkPlan | None = None,
    bwrap: str = DEBIAN_BWRAP,
) -> list[str]:
    """The argv that runs `command` (with the spec's args) in bubblewrap. Pure: no filesystem access.

    `project` and `state_dir` are descriptors bound writable at their destinations (and the
    project again at each of `project_aliases`); `data_dir`, `roots` and the directories in
    `hide` are covered with an empty tmpfs (after /tmp, /run and `home`, and after `code` — the
    agent's installation and the product's code, which may live under /tmp or a root's home —
    is bound back read-only over those), the files in `mask` with /dev/null. `keep` are bound
    back read-only after hiding (the resolver's directory under /run, Hermes' code in the
    operator's hidden home); `read_only` binds descriptors of files read-only into the state
    directory. Order matters to bwrap: every mount covers the ones before it, so hiding comes
    first and the binds of what the agent may use come last, on top. With `run_as`, the agent
    becomes that account through setpriv before it runs; `home` (the root runner's own) is hidden.
    With `network`, the agent gets a network namespace of its own (loopback only) and, when the
    plan has a proxy, runs behind netbridge, which relays its loopback port to the proxy's socket.
    """
    argv = [
        bwrap,
        "--die-with-parent",  # the runner gone (even SIGKILLed), the agent goes too
        "--unshare-pid",
        "--unshare-ipc",
        "--new-session",  # no TIOCSTI into the runner's terminal
        *(["--unshare-net"] if network is not None and network.unshare else []),
        # A service run as root keeps every capability in bwrap otherwise: enough to unmount
        # the tmpfs over the data directory and read what it hides.
        "--cap-drop",
        "ALL",
    ]
    if run_as is not None:
        for cap in ROOT_CAPS:
            argv += ["--cap-add", cap]
    argv += [
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",  # a fresh /proc: only the sandbox's own processes
    ]
    covered = [Path("/tmp"), Path("/run"), *([home] if home is not None else [])]
    for path in covered:
        # A /tmp the agent account can write (sticky, as a host's): Claude and Codex keep files there.
        argv += [*(["--perms", "1777"] if path == Path("/tmp") else []), "--tmpfs", str(path)]
    for path in code:
        argv += _parents(path, covered)
        argv += ["--ro-bind-try", str(path), str(path)]
    hidden = _outermost([data_dir, *roots, *hide])
    for path in hidden:
        argv += ["--tmpfs", str(path)]
    covered += hidden
    for path in keep:
        argv += _parents(path, covered)
        argv += ["--ro-bind-try", str(path), str(path)]
    for path in mask:
        argv += ["--ro-bind", "/dev/null", str(path)]
    for destination in (project.destination, *(p for p in project_aliases if p != project.destination)):
        argv += _parents(destination, covered)
        argv += ["--bind-fd", str(project.fd), str(destination)]
    argv += _parents(state_dir.destination, covered)
    argv += ["--bind-fd", str(state_dir.fd), str(state_dir.destination)]
    for bound, writable in git:  # a worktree's repository: (bound, writable), docs/worktrees.md
        argv += _parents(bound.destination, covered)
        argv += ["--bind-fd" if writable else "--ro-bind-fd", str(bound.fd), str(bound.destination)]
    for bound in read_only:
        argv += ["--ro-bind-fd", str(bound.fd), str(bound.destination)]
    proxy = network.proxy_dir if network is not None else None
    if proxy is not None:
        argv += _parents(proxy.destination, covered)
        argv += ["--bind-fd", str(proxy.fd), str(proxy.destination)]
    argv += ["--chdir", str(project.destination), "--"]
    if run_as is not None:
        # Before the bridge: a change of user clears the bridge's parent-death signal.
        argv += [SETPRIV, f"--reuid={run_as.uid}", f"--regid={run_as.gid}", "--clear-groups"]
        argv += ["--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all", "--"]
    if proxy is not None:
        return [*argv, *bridge_argv(proxy.destination / PROXY_SOCKET, command, spec.args)]
    return [*argv, command, *spec.args]


def _parents(destination: Path, covered: Sequence[Path]) -> list[str]:
    """bwrap makes a bind's missing parents with the host directory's mode (0700 under a root's
    home or a private /tmp dir), which an unprivileged agent cannot cross: inside a tmpfs they
    are made 0755 first."""
    out: list[str] = []
    for parent in reversed(destination.parents):
        if any(parent != top and parent.is_relative_to(top) for top in covered):
            out += ["--perms", "0755", "--dir", str(parent)]
    return out


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
    home = agent_homes.home_of(spec.command, spec.env)
    if home is not None:  # Codex's CODEX_HOME (and TMPDIR), Claude's CLAUDE_CONFIG_DIR: per user
        env.update(agent_homes.agent_home_env(home, spec.env, state_dir))
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
    network: NetworkPolicy | None = None,
    proxy_dir: Path | None = None,
    worktree: AgentTree | None = None,
) -> Launch:
    """Make the user's state directory and say how to start the agent (in bwrap when it applies).

    `network`: the entry's policy (default: the entry's own); `proxy_dir`: where the runner's
    proxy for this agent listens (its PROXY_SOCKET), when the policy lets the agent out.

    Raises SandboxUnavailable for an agent that requires the sandbox where it does not work, or
    that would run unsandboxed on a root runner; UnsafePath when the project or the state
    directory holds a symlink now; AgentAccountUnavailable; ValueError for a bad
    HERMESWEB_SANDBOX_HIDE. The caller closes the returned Launch's descriptors after the spawn.
    """
    use, why = agents.sandboxed(spec)
    if not use and spec.sandbox == "required":
        raise SandboxUnavailable(f"agent {spec.name!r} requires the sandbox, and {why}")
    run_as = agent_account(environ)
    if not use and run_as is not None:
        # Unsandboxed it would run as root, or as an account that cannot reach its own state.
        raise SandboxUnavailable(
            f"agent {spec.name!r} would run unsandboxed ({why}) on a runner that runs as root; "
            "run the service as an unprivileged user or let the agent use the sandbox"
        )
    _make_private_dirs(state_dir, stop_at=data_dir)
    operator_home = agent_homes.prepare_home(command, spec.env, state_dir, environ)
    shared = _hermes_shared_files(spec, state_dir, environ) if spec.is_hermes else []
    env = agent_env(spec, state_dir, sandboxed=use, environ=environ)
    policy = network if network is not None else policy_for(spec.network, environ)
    if use and proxy_dir is not None:
        env.update(proxy_env())
    if not use:
        for source, destination in shared:
            _copy_private(source, destination)  # no bind outside the sandbox: a fresh copy each start
        return Launch(command, list(spec.args), env, sandboxed=False, unsandboxed_because=why)
    hide, mask = [], []
    keep = _resolver_dirs()
    for path in hidden_paths(environ):
        (hide if path.is_dir() else mask if path.exists() else []).append(path)
    if operator_home is not None:
        hide.append(operator_home)
    if spec.is_hermes:
        # The operator's own Hermes sessions and memories; only the shared files are bound in.
        home = spec.operator_hermes_home(environ).resolve()
        if home.is_dir():
            hide.append(home)
            installed = Path(command).resolve()
            if installed.is_relative_to(home):
                # Hermes' installer puts the code in ~/.hermes/hermes-agent: that stays readable.
                keep.append(home / installed.relative_to(home).parts[0])
    fds: list[int] = []
    try:
        # Opened now, bound by descriptor: a symlink swapped in after the path check binds nothing.
        project_fd = _opened(fds, open_directory(project))
        state_fd = _opened(fds, open_directory(state_dir.resolve()))
        if run_as is not None:
            give_tree(project_fd, run_as.uid, run_as.gid)
            give_tree(state_fd, run_as.uid, run_as.gid)
        git = _worktree_git(fds, worktree, run_as)
        read_only = [
            Bound(_opened(fds, open_file(source.resolve())), destination)
            for source, destination in _readable_copies(shared, state_dir, run_as)
        ]
        plan = NetworkPlan(unshare=policy.unshare_net)
        if proxy_dir is not None:
            plan = NetworkPlan(True, Bound(_opened(fds, open_directory(proxy_dir)), proxy_dir))
        aliases = [Path(cwd)] if os.path.normpath(cwd) != str(project) else []
        argv = bwrap_argv(
            spec,
            command,
            project=Bound(project_fd, project),
            state_dir=Bound(state_fd, state_dir.resolve()),
            data_dir=data_dir.resolve(),
            roots=[Path(r).resolve() for r in roots],
            hide=hide,
            mask=mask,
            keep=keep,
            read_only=read_only,
            git=git,
            project_aliases=aliases,
            code=code_dirs(command),
            run_as=run_as,
            home=_runner_home() if run_as is not None else None,
            network=plan,
            bwrap=agents.bwrap().path or DEBIAN_BWRAP,
        )
    except BaseException:
        Launch("", [], {}, sandboxed=True, fds=tuple(fds)).close_fds()
        raise
    return Launch(argv[0], argv[1:], env, sandboxed=True, fds=tuple(fds))


def _worktree_git(
    fds: list[int], worktree: AgentTree | None, run_as: AgentAccount | None
) -> list[tuple[Bound, bool]]:
    """The main repository's git directory read-only, and what a commit on the worktree's branch
    writes (objects, refs, logs, its own worktrees/<name>) writable over it: docs/worktrees.md."""
    if worktree is None:
        return []
    common = _opened(fds, open_directory(worktree.git_common))
    if run_as is not None:
        give_tree(common, run_as.uid, run_as.gid)  # git reads it all; a plain session gets it too
    binds = [(Bound(common, worktree.git_common), False)]
    for path in worktree.git_writable:
        binds.append((Bound(_opened(fds, open_directory(path)), path), True))
    return binds


def _opened(fds: list[int], fd: int) -> int:
    fds.append(fd)
    return fd


def _runner_home() -> Path | None:
    """A root runner's home (root's own files): hidden from agents, which run as another account."""
    home = Path(os.path.expanduser("~")).resolve()
    return home if home != Path("/") else None


def _readable_copies(
    shared: list[tuple[Path, Path]], state_dir: Path, run_as: AgentAccount | None
) -> list[tuple[Path, Path]]:
    """The operator's files to bind read-only, as (source, destination).

    Run as the service's user, the operator's own files are bound. Run as the agent account,
    which cannot read a 0600 file of root's, a copy it owns (0400) is bound instead; it lies
    beside the state directory, not in it, so the agent cannot rewrite it.
    """
    if run_as is None or not shared:
        return shared
    copies = state_dir.parent / f".{state_dir.name}-operator"
    _make_private_dirs(copies, stop_at=state_dir.parent)
    out = []
    for source, destination in shared:
        copy = copies / source.name
        _copy_private(source, copy)
        os.chown(copy, run_as.uid, run_as.gid)
        os.chmod(copy, 0o400)
        out.append((copy, destination))
    return out


def code_dirs(command: str) -> list[Path]:
    """What the agent runs from: its command's installation (a virtualenv's root and the Python
    it was made from) and this product's code with the runner's Python (the demo agent is
    `python -m runs.demo_agent`); any may sit under /tmp or a root runner's hidden home."""
    dirs = [Path(settings.BASE_DIR).resolve(), Path(sys.prefix), Path(sys.base_prefix).resolve()]
    path = Path(command)
    if path.is_absolute() and path.parent.name == "bin":
        venv = path.parent.parent  # not resolved: a venv's python links out of the venv
        dirs.append(venv)
        base = _venv_base(venv)
        if base is not None:
            dirs.append(base)
    return list(dict.fromkeys(dirs))


def _venv_base(venv: Path) -> Path | None:
    """The installation a virtualenv's python links to (pyvenv.cfg's `home` is its bin/)."""
    try:
        lines = (venv / "pyvenv.cfg").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            return Path(value.strip()).resolve().parent
    return None


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
