"""git as the worktrees use it: one subprocess per call, never a hook, never a pager.

The worktree belongs to the agent's account (a root runner gives it away), so every call
trusts exactly the directories it names (`safe.directory`) and runs no hook or fsmonitor an
agent could have planted.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

GIT = "git"
TIMEOUT = 600.0
# Command-line config is "protected" config: git honours safe.directory from it.
SAFE = ("-c", "safe.directory=*", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false")


class GitFailed(Exception):
    def __init__(self, argv: Sequence[str], code: int, stderr: str) -> None:
        super().__init__(f"git {' '.join(argv)} exited {code}: {stderr.strip()[:500]}")
        self.code, self.stderr = code, stderr


@dataclass(frozen=True)
class Done:
    code: int
    out: str
    err: str


def run(
    cwd: str | Path,
    *argv: str,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
) -> Done:
    environ = {
        **os.environ,
        "GIT_TERMINAL_PROMPT": "0",
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        **(env or {}),
    }
    environ.pop("GIT_DIR", None)
    environ.pop("GIT_WORK_TREE", None)
    try:
        proc = subprocess.run(
            [GIT, *SAFE, *argv],
            cwd=str(cwd),
            env=environ,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:  # a directory gone, a NUL
        if check:
            raise GitFailed(argv, -1, str(exc)) from None
        return Done(-1, "", str(exc))
    if check and proc.returncode != 0:
        raise GitFailed(argv, proc.returncode, proc.stderr)
    return Done(proc.returncode, proc.stdout, proc.stderr)


def out(cwd: str | Path, *argv: str) -> str:
    return run(cwd, *argv).out.strip()


def toplevel(path: str | Path) -> Path | None:
    """The repository's top directory when `path` is the top of a git checkout, else None."""
    done = run(path, "rev-parse", "--show-toplevel", check=False)
    if done.code != 0:
        return None
    top = Path(done.out.strip()).resolve()
    return top if top == Path(path).resolve() else None


def common_dir(path: str | Path) -> Path:
    """The repository's shared git directory (objects, refs) as an absolute path."""
    return Path(out(path, "rev-parse", "--path-format=absolute", "--git-common-dir")).resolve()


def git_dir(path: str | Path) -> Path:
    """This checkout's own git directory (a linked worktree's `.git/worktrees/<name>`)."""
    return Path(out(path, "rev-parse", "--path-format=absolute", "--git-dir")).resolve()


def current_branch(path: str | Path) -> str | None:
    done = run(path, "symbolic-ref", "--quiet", "--short", "HEAD", check=False)
    return done.out.strip() or None if done.code == 0 else None


def valid_branch_name(name: str) -> bool:
    if not name or name.startswith("-"):  # never taken for an option
        return False
    done = run("/", "check-ref-format", "--branch", name, check=False)
    return done.code == 0 and done.out.strip() == name


def rev(path: str | Path, ref: str) -> str | None:
    done = run(path, "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}", check=False)
    return done.out.strip() or None if done.code == 0 else None


def branch_exists(path: str | Path, branch: str) -> bool:
    return run(path, "show-ref", "--verify", "--quiet", f"refs/heads/{branch}", check=False).code == 0


def is_ancestor(path: str | Path, older: str, newer: str) -> bool:
    return run(path, "merge-base", "--is-ancestor", older, newer, check=False).code == 0


def ahead_behind(path: str | Path, branch: str, base: str) -> tuple[int, int]:
    done = run(path, "rev-list", "--left-right", "--count", f"{branch}...{base}", check=False)
    if done.code != 0:
        return 0, 0
    left, right = done.out.split()
    return int(left), int(right)


def status(path: str | Path, paths: Sequence[str] = ()) -> list[str]:
    """`git status --porcelain` lines (untracked files included), limited to `paths` if given."""
    argv = ["status", "--porcelain=v1", "-z", "--untracked-files=all"]
    if paths:
        argv += ["--", *[f":(literal){p}" for p in paths]]
    return [line for line in run(path, *argv).out.split("\0") if line]


def changed_paths(path: str | Path, old: str, new: str) -> list[str]:
    return [p for p in run(path, "diff", "--name-only", "-z", "--no-renames", old, new).out.split("\0") if p]


def out_env(cwd: str | Path, env: Mapping[str, str], *argv: str) -> str:
    return run(cwd, *argv, env=env).out.strip()
