"""A worktree's branch brought into its base without ever leaving anything half-merged.

docs/worktrees.md, "Merge rules". The result is computed away from both checkouts (the
session's uncommitted work as a commit object, `git merge-tree --write-tree`, a rebase in a
temporary detached worktree); only when it is clean — no conflict, none of the files it
changes dirty in the main checkout — do refs and files move: the main checkout by a two-tree
`read-tree -m -u` (unrelated local changes kept), then the base ref, then the session's branch.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from worktrees import conf, git


@dataclass(frozen=True)
class Author:
    name: str
    email: str

    def env(self) -> dict[str, str]:
        # The user authors and commits: the merge is their action, not the agent's.
        return {
            "GIT_AUTHOR_NAME": self.name,
            "GIT_AUTHOR_EMAIL": self.email,
            "GIT_COMMITTER_NAME": self.name,
            "GIT_COMMITTER_EMAIL": self.email,
        }


@dataclass(frozen=True)
class Plan:
    """What the merge would need of the repository; nothing has moved yet."""

    repo: Path
    tree: Path
    branch: str
    base: str
    strategy: str
    message: str
    author: Author


class MergeConflict(Exception):
    def __init__(self, paths: list[str]) -> None:
        super().__init__(f"conflicts in {', '.join(paths)}")
        self.paths = paths


class BaseDirty(Exception):
    def __init__(self, paths: list[str]) -> None:
        super().__init__(f"uncommitted changes in {', '.join(paths)}")
        self.paths = paths


def merge(plan: Plan) -> str:
    """The new tip of `plan.base`; raises MergeConflict or BaseDirty with everything as it was."""
    repo, env = plan.repo, plan.author.env()
    tip = _tip(repo, plan.branch)
    base_tip = _tip(repo, plan.base)
    work = snapshot(plan.tree, tip, plan.message, plan.author)
    if git.is_ancestor(repo, work, base_tip):
        new = base_tip  # nothing of the branch is missing from the base
    elif plan.strategy == "rebase":
        new = _rebased(repo, base_tip, work, env)
    elif plan.strategy == "merge" and git.is_ancestor(repo, base_tip, work):
        new = work  # a fast-forward
    else:
        tree = _merged_tree(repo, base_tip, work)
        parents = ["-p", base_tip] + (["-p", work] if plan.strategy == "merge" else [])
        message = plan.message or f"Merge branch '{plan.branch}' into {plan.base}"
        new = git.run(repo, "commit-tree", tree, *parents, "-F", "-", env=env, stdin=message).out.strip()
    _move_base(repo, plan.base, base_tip, new)
    # The session goes on from the merged state: its branch follows, its files with it.
    git.run(repo, "update-ref", f"refs/heads/{plan.branch}", new, tip)
    git.run(plan.tree, "reset", "--quiet", "--hard", new)
    return new


def snapshot(tree: Path, tip: str, message: str, author: Author) -> str:
    """The worktree as it is (untracked files too, ignored ones not) as a commit on `tip`, written
    through a private index: neither the branch nor the worktree's index moves."""
    if not git.status(tree):
        return tip
    with tempfile.TemporaryDirectory(prefix="hermesweb-index-") as scratch:
        index = Path(scratch) / "index"
        own = git.git_dir(tree) / "index"
        if own.is_file():
            shutil.copyfile(own, index)
        env = {**author.env(), "GIT_INDEX_FILE": str(index)}
        git.run(tree, "add", "--all", env=env)
        written = git.out_env(tree, env, "write-tree")
    text = message or "Work from the session's worktree"
    return git.run(
        tree, "commit-tree", written, "-p", tip, "-F", "-", env=author.env(), stdin=text
    ).out.strip()


def _tip(repo: Path, branch: str) -> str:
    sha = git.rev(repo, f"refs/heads/{branch}")
    if sha is None:
        raise git.GitFailed(["rev-parse", branch], 1, f"branch {branch!r} does not exist")
    return sha


def _merged_tree(repo: Path, base_tip: str, work: str) -> str:
    done = git.run(
        repo, "merge-tree", "--write-tree", "--name-only", "-z", "--no-messages", base_tip, work, check=False
    )
    fields = done.out.split("\0\0")[0].split("\0")
    if done.code == 1:
        raise MergeConflict(sorted({p for p in fields[1:] if p}))
    if done.code != 0:
        raise git.GitFailed(["merge-tree"], done.code, done.err)
    return fields[0].strip()


def _rebased(repo: Path, base_tip: str, work: str, env: dict[str, str]) -> str:
    """The branch's commits replayed on the base, in a temporary detached worktree."""
    scratch = conf.root() / ".merging" / uuid.uuid4().hex
    scratch.parent.mkdir(parents=True, exist_ok=True)
    git.run(repo, "worktree", "add", "--quiet", "--detach", str(scratch), work)
    try:
        done = git.run(scratch, "rebase", "--quiet", base_tip, env=env, check=False)
        if done.code != 0:
            conflicts = git.run(scratch, "diff", "--name-only", "-z", "--diff-filter=U", check=False)
            git.run(scratch, "rebase", "--abort", check=False)
            paths = sorted({p for p in conflicts.out.split("\0") if p})
            if not paths:
                raise git.GitFailed(["rebase"], done.code, done.err)
            raise MergeConflict(paths)
        return git.out(scratch, "rev-parse", "HEAD")
    finally:
        git.run(repo, "worktree", "remove", "--force", str(scratch), check=False)
        shutil.rmtree(scratch, ignore_errors=True)
        git.run(repo, "worktree", "prune", check=False)


def _move_base(repo: Path, base: str, base_tip: str, new: str) -> None:
    if new == base_tip:
        return
    if git.current_branch(repo) == base:
        # The main checkout has the base out: its files follow, refused if the merge would touch
        # a file with uncommitted changes there (git status: staged, unstaged or untracked).
        touched = git.changed_paths(repo, base_tip, new)
        dirty = sorted({line[3:] for line in git.status(repo, touched)}) if touched else []
        if dirty:
            raise BaseDirty(dirty)
        git.run(repo, "read-tree", "-m", "-u", base_tip, new)
    git.run(repo, "update-ref", f"refs/heads/{base}", new, base_tip)
