"""A session's worktree made (issue 41; docs/worktrees.md) against `git worktree add` alone.

On a generated repository (`--files` files of `--size` bytes, 10,000 files of 1 KB by default,
one commit): what the runner does before a worktree session's first turn
(`worktrees.trees.prepare_tree`: `git worktree add -b`, then its checks that the worktree is
usable) against plain `git worktree add -b <branch> <path> <commit>` on the same repository,
alternately, `--samples` times each; each worktree removed before the next. Prints the medians
and their ratio (target ≤ 1.2: the checks are a few `rev-parse`s beside a 10,000-file checkout).

Run alone: `python bench/worktree.py [--files N] [--size BYTES] [--samples N]`. It uses a data
directory and a repository of its own under a temporary directory, removed at the end; no
database is touched (the row is not saved).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

IDENT = {
    "GIT_AUTHOR_NAME": "bench",
    "GIT_AUTHOR_EMAIL": "bench@example.com",
    "GIT_COMMITTER_NAME": "bench",
    "GIT_COMMITTER_EMAIL": "bench@example.com",
}


def git(cwd: Path, *argv: str) -> str:
    done = subprocess.run(
        ["git", *argv], cwd=cwd, env={**os.environ, **IDENT}, check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


def make_repo(root: Path, files: int, size: int) -> str:
    per_dir = 100
    for index in range(files):
        directory = root / f"d{index // per_dir}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"f{index % per_dir}.txt").write_bytes(os.urandom(size // 2).hex().encode()[:size])
    git(root, "init", "-q", "--initial-branch=main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "initial")
    return git(root, "rev-parse", "HEAD")


def remove(repo: Path, path: Path, branch: str) -> None:
    git(repo, "worktree", "remove", "--force", str(path))
    git(repo, "branch", "-q", "-D", branch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=1_000)
    parser.add_argument("--samples", type=int, default=7)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="hermesweb-bench-worktree-"))
    os.environ["HERMESWEB_DATA_DIR"] = str(work / "data")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hermesweb.settings")
    import django

    django.setup()
    from worktrees import trees
    from worktrees.models import Worktree

    try:
        repo = work / "repo"
        commit = make_repo(repo, args.files, args.size)
        ours, plain = [], []
        for sample in range(args.samples):
            path = work / "trees" / f"ours-{sample}"
            row = Worktree(
                branch=f"ours-{sample}", base="main", base_commit=commit, path=str(path), repository=str(repo)
            )
            started = time.perf_counter()
            problem = trees.prepare_tree(row)
            ours.append(time.perf_counter() - started)
            assert problem == "", problem
            remove(repo, path, row.branch)

            path = work / "trees" / f"plain-{sample}"
            started = time.perf_counter()
            git(repo, "worktree", "add", "-q", "-b", f"plain-{sample}", str(path), commit)
            plain.append(time.perf_counter() - started)
            remove(repo, path, f"plain-{sample}")
        ours_median, plain_median = statistics.median(ours), statistics.median(plain)
        ratio = ours_median / plain_median
        print(f"repository: {args.files} files of {args.size} bytes; {args.samples} samples, alternately")
        print(f"worktree for a session (prepare_tree): median {ours_median * 1000:.0f} ms")
        print(f"git worktree add alone:                median {plain_median * 1000:.0f} ms")
        print(f"ratio: {ratio:.2f}x (target <= 1.2)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
