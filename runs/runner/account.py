"""The OS account agents run as: never root.

A runner that runs as root (a container, CI) would otherwise start agents as uid 0, and root
reads `/etc/shadow` and every 0600 file through the sandbox's read-only view of the host. So a
root runner starts every agent as a dedicated unprivileged account (HERMESWEB_AGENT_USER,
default `hermesweb-agent`, created on first use) and gives it the project and the user's state
directory; a runner that is not root starts agents as its own user, as before.
"""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_AGENT_USER = "hermesweb-agent"


@dataclass(frozen=True)
class AgentAccount:
    """The unprivileged account a root runner starts agents as."""

    name: str
    uid: int
    gid: int


class AgentAccountUnavailable(OSError):
    """The runner is root and has no unprivileged account to start an agent as."""


def agent_account(environ: Mapping[str, str] = os.environ) -> AgentAccount | None:
    """The account to start agents as, or None when the runner is not root (its own user).

    Raises AgentAccountUnavailable when the runner is root and the account cannot be found or
    made, or is root itself: then no agent starts.
    """
    if os.geteuid() != 0:
        return None
    return _account(environ.get("HERMESWEB_AGENT_USER") or DEFAULT_AGENT_USER)


@functools.cache
def _account(name: str) -> AgentAccount:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        entry = _create(name)
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise AgentAccountUnavailable(f"HERMESWEB_AGENT_USER {name!r} is root: agents never run as root")
    return AgentAccount(name, entry.pw_uid, entry.pw_gid)


def _create(name: str) -> pwd.struct_passwd:
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    argv = [useradd, "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent"]
    argv += ["--shell", "/usr/sbin/nologin", name]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise AgentAccountUnavailable(f"cannot create the agent account {name!r}: {exc}") from None
    try:
        return pwd.getpwnam(name)  # another runner may have made it meanwhile (useradd then fails)
    except KeyError:
        raise AgentAccountUnavailable(
            f"cannot create the agent account {name!r}: {done.stderr.strip()[:300]}"
        ) from None
