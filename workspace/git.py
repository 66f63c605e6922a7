"""The project's own git repository: its branch and dirty files, and a commit of ticked files.

Design note: docs/workspace.md ("Git"). Only a project whose top holds a `.git` directory (not a
link, not a `gitdir:` file) is a repository here; git runs in the project entered through its
descriptor (workspace/fs.py), with `GIT_DIR=.git`, so it never looks upward nor follows a name.
The project's repository is the agent's to write, and the web may run as root, so git runs only
plumbing that starts no program the repository names: hooks (`core.hooksPath=/dev/null`),
fsmonitor and signing are turned off on the command line, no system or user configuration is
read, and nothing reads the working tree through git (a filter driver would run): the status is
computed here, hashing the files as they are on disk, and a commit is built in a temporary index
from those bytes (`hash-object --no-filters`). What git wrote is handed back to the project
directory's owner. The branch moves only from the HEAD the commit was built on; no push, ever.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.db import IntegrityError, transaction

from projects.models import Project
from projects.pathfd import give_tree
from projects.refusals import Refused
from workspace import conf, fs
from workspace.models import GitCommit
from worktrees import git as worktree_git

log = logging.getLogger(__name__)

GIT_TIMEOUT = 60
MAX_FILES = 2_000  # dirty files listed
MAX_COMMIT_PATHS = 1_000
ZERO = "0" * 40
FAR_AHEAD = 4_102_444_800  # 2100-01-01: an index "written" then makes no entry racily clean
# A placeholder author's domain: `.invalid` is reserved (RFC 2606), so it is nobody's address.
PLACEHOLDER_DOMAIN = "hermesweb.invalid"


class GitError(Exception):
    pass


@dataclass(frozen=True)
class DirtyFile:
    path: str
    index: str  # git's X column: " " unchanged, M, A, D, T, U, ? (untracked)
    worktree: str  # git's Y column


@dataclass(frozen=True)
class GitState:
    repository: bool
    branch: str | None  # None: detached HEAD
    head: str | None  # None: no commit yet
    files: list[DirtyFile]
    truncated: bool


@dataclass(frozen=True)
class Committed:
    status: str  # committed | duplicate
    commit: str
    branch: str | None
    paths: list[str]


# The git directory of the checkout being worked on: ".git" for the project's own, or a worktree
# session's private `<common>/worktrees/<name>` (absolute, checked by `worktree_git_dir`). Set
# for the length of one call of `git_state`/`do_commit`, so every helper below needs no argument.
GIT_DIR: contextvars.ContextVar[str] = contextvars.ContextVar("workspace_git_dir", default=".git")


def _env(owner_home: str = "/nonexistent") -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GIT_DIR": GIT_DIR.get(),
        "GIT_WORK_TREE": ".",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_ATTR_NOSYSTEM": "1",
        "HOME": owner_home,
        "LC_ALL": "C",
        "GIT_TERMINAL_PROMPT": "0",
    }


# Overrides of whatever the repository's own config says: nothing of it runs a program.
OVERRIDES = (
    "safe.directory=*",
    f"core.hooksPath={os.devnull}",
    "core.fsmonitor=false",
    "core.quotePath=false",
    "commit.gpgSign=false",
    "core.untrackedCache=false",
    f"core.attributesFile={os.devnull}",
    "gc.auto=0",
)


def _git(root: int, *args: str, stdin: bytes | None = None, extra_env: dict[str, str] | None = None) -> bytes:
    """Run git (plumbing only) in the project opened as `root`."""
    argv = ["git"]
    for override in OVERRIDES:
        argv += ["-c", override]
    argv += list(args)
    try:
        result = subprocess.run(
            argv,
            env={**_env(), **(extra_env or {})},
            cwd=f"/proc/self/fd/{root}",  # the opened directory, not a name a symlink could redirect
            pass_fds=(root,),
            input=stdin,
            capture_output=True,
            timeout=GIT_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GitError(f"git {args[0]}: {exc}") from None
    if result.returncode != 0:
        raise GitError(f"git {args[0]}: {result.stderr.decode(errors='replace').strip()}")
    return result.stdout


def _is_repository(root: int) -> bool:
    if GIT_DIR.get() != ".git":
        return True  # a worktree session's: its git directory was checked when it was named
    try:
        info = os.lstat(".git", dir_fd=root)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode)


def _open_git_dir(root: int) -> int:
    """A descriptor on the git directory in use (fs.Outside when it is not a plain directory)."""
    where = GIT_DIR.get()
    return fs.open_dir(root, [".git"]) if where == ".git" else fs.open_root(where)


@contextlib.contextmanager
def _using(git_dir: str | None) -> Iterator[None]:
    token = GIT_DIR.set(git_dir or ".git")
    try:
        yield
    finally:
        GIT_DIR.reset(token)


def worktree_git_dir(tree: str, repository: str) -> str:
    """A worktree session's own git directory, which must lie in the main repository's
    `.git/worktrees/` (its `.git` file is the agent's to write: never followed elsewhere).
    fs.Outside when it does not."""
    try:
        own = worktree_git.git_dir(tree)
        common = worktree_git.common_dir(repository)
    except (worktree_git.GitFailed, OSError) as exc:
        raise fs.Outside(f"{tree}: {exc}") from None
    if own.parent != common / "worktrees":
        raise fs.Outside(f"{tree}: its git directory is not one of {repository}'s worktrees")
    return str(own)


def _head(root: int) -> tuple[str | None, str | None]:
    """(branch, commit): branch None when detached, commit None before the first commit."""
    try:
        branch: str | None = _git(root, "symbolic-ref", "-q", "--short", "HEAD").decode().strip() or None
    except GitError:
        branch = None
    try:
        head: str | None = _git(root, "rev-parse", "-q", "--verify", "HEAD^{commit}").decode().strip()
    except GitError:
        head = None
    return branch, head


def git_state(project: Project, tree: str | None = None, git_dir: str | None = None) -> GitState:
    """The project's branch and dirty files (untracked ones listed file by file).

    git's own `status` is not run: it may read files through a filter driver the repository
    names. The index and HEAD are listed with plumbing; each tracked file's bytes are hashed
    here, from the project opened without following a symlink. `tree` and `git_dir`: a worktree
    session's checkout and its git directory (`worktree_git_dir`) instead of the project's.
    """
    with _using(git_dir), fs.project_root(tree or project.path) as root:
        if not _is_repository(root):
            return GitState(False, None, None, [], False)
        branch, head = _head(root)
        blob_id = _blob_hasher(root)
        committed = _entries(_git(root, "ls-tree", "-r", "-z", "--full-tree", head)) if head else {}
        indexed = _staged(_git(root, "ls-files", "-s", "-z"))
        untracked = _git(root, "ls-files", "-z", "-o", "--exclude-standard").split(b"\x00")
        files: list[DirtyFile] = []
        for path in sorted(set(committed) | set(indexed)):
            index_state = _compare(committed.get(path), indexed.get(path))
            entry = indexed.get(path)
            if entry is not None and entry[2] != "0":
                files.append(DirtyFile(path, "U", "U"))
                continue
            worktree_state = " "
            if entry is not None and entry[0] != "160000":  # a nested repository: its own business
                on_disk = _on_disk(root, path, blob_id)
                worktree_state = "D" if on_disk is None else _compare(entry[:2], on_disk)
            if index_state != " " or worktree_state != " ":
                files.append(DirtyFile(path, index_state, worktree_state))
        for raw in untracked:
            if raw:
                files.append(DirtyFile(raw.decode("utf-8", errors="replace"), "?", "?"))
    files.sort(key=lambda f: f.path)
    return GitState(True, branch, head, files[:MAX_FILES], len(files) > MAX_FILES)


def _entries(listing: bytes) -> dict[str, tuple[str, str]]:
    """`ls-tree -r -z` → {path: (mode, object id)}."""
    out = {}
    for record in listing.split(b"\x00"):
        if record:
            meta, _, path = record.partition(b"\t")
            mode, _, oid = meta.decode().split(" ")
            out[path.decode("utf-8", errors="replace")] = (mode, oid)
    return out


def _staged(listing: bytes) -> dict[str, tuple[str, str, str]]:
    """`ls-files -s -z` → {path: (mode, object id, stage)} (a conflict's highest stage)."""
    out = {}
    for record in listing.split(b"\x00"):
        if record:
            meta, _, path = record.partition(b"\t")
            mode, oid, stage = meta.decode().split(" ")
            out[path.decode("utf-8", errors="replace")] = (mode, oid, stage)
    return out


def _compare(before: tuple[str, ...] | None, after: tuple[str, ...] | None) -> str:
    if before is None:
        return " " if after is None else "A"
    if after is None:
        return "D"
    return " " if tuple(before[:2]) == tuple(after[:2]) else "M"


def _blob_hasher(root: int) -> Callable[[bytes], str]:
    """Git's object id of a blob holding `data`, in the repository's object format."""
    object_format = _git(root, "rev-parse", "--show-object-format").decode().strip()
    algorithm = hashlib.sha256 if object_format == "sha256" else hashlib.sha1
    return lambda data: algorithm(b"blob %d\x00" % len(data) + data).hexdigest()


# (device, inode, size, mtime, ctime, mode) → (git mode, blob id): a file not written since it
# was last hashed is not read again (ctime moves on any write or chmod). Bounded by clearing.
_hashed: dict[tuple[int, ...], tuple[str, str]] = {}
MAX_HASHED = 100_000


def _on_disk(root: int, path: str, blob_id: Callable[[bytes], str]) -> tuple[str, str] | None:
    """(mode, blob id) of `path` as it is on disk; None when it is gone (or not a file's place)."""
    try:
        info = _lstat(root, path)
    except fs.Outside:
        return None
    if info is None:
        return None
    key = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_mode)
    if key in _hashed:
        return _hashed[key]
    found = _read_entry(root, path)
    if found is None:
        return None
    mode, data = found
    if len(_hashed) >= MAX_HASHED:
        _hashed.clear()
    _hashed[key] = (mode, blob_id(data))
    return _hashed[key]


def _lstat(root: int, path: str) -> os.stat_result | None:
    parts = fs.parts_of(path)
    parent = fs.open_dir(root, parts[:-1])
    try:
        return os.lstat(parts[-1], dir_fd=parent)
    except FileNotFoundError:
        return None
    finally:
        os.close(parent)


def _read_entry(root: int, path: str) -> tuple[str, bytes] | None:
    """(git mode, bytes) of the file or symlink `path`; None when there is none."""
    parts = fs.parts_of(path)
    try:
        parent = fs.open_dir(root, parts[:-1])
    except fs.Outside:
        return None
    try:
        try:
            info = os.lstat(parts[-1], dir_fd=parent)
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(info.st_mode):
            return "120000", os.fsencode(os.readlink(parts[-1], dir_fd=parent))
        if not stat.S_ISREG(info.st_mode):
            return None
    finally:
        os.close(parent)
    try:
        data, opened = fs.read_file(root, path, conf.file_max_bytes())
    except fs.TooBig:
        raise Refused(413, "file_too_large", f"{path!r} is too large to read here.") from None
    return ("100755" if opened.st_mode & 0o111 else "100644"), data


def author_of(user: Any) -> tuple[str, str]:
    """The commit's author: the user's name and email, else their username at a reserved domain."""
    name = (user.get_full_name() or "").strip() or user.get_username()
    email = (user.email or "").strip() or f"{user.get_username()}@{PLACEHOLDER_DOMAIN}"
    return name, email


def do_commit(
    user: Any,
    project: Project,
    *,
    message: str,
    paths: list[str],
    client_id: str,
    tree: str | None = None,
    git_dir: str | None = None,
) -> Committed:
    """Commit exactly `paths` (their state on disk: changed, added or deleted) on the branch.

    Preconditions: `project` is the user's (the caller looked it up). 422 `path_outside` for a
    path that is not a plain one inside the project, 422 `not_a_file` for a directory; 409
    `not_git_repo`; 409 `nothing_to_commit` when those paths match HEAD already; 409 `git_busy`
    when the branch moved meanwhile or git refused. Idempotent by `client_id` per project.
    """
    wanted = list(dict.fromkeys(paths))
    if not wanted or len(wanted) > MAX_COMMIT_PATHS:
        raise Refused(422, "invalid_paths", f"Tick between 1 and {MAX_COMMIT_PATHS} files to commit.")
    for path in wanted:
        try:
            parts = fs.parts_of(path)
        except fs.Outside:
            parts = []
        if not parts or parts[0] == ".git":
            raise Refused(422, "path_outside", f"{path!r} is not a path inside the project.", {"path": path})
    with transaction.atomic():
        # One commit of a project at a time; the same client_id answers the first commit.
        Project.objects.select_for_update().filter(pk=project.pk).first()
        earlier = GitCommit.objects.filter(project=project, client_id=client_id).first()
        if earlier is not None:
            return Committed("duplicate", earlier.commit, earlier.branch or None, list(earlier.paths))
        with _using(git_dir), fs.project_root(tree or project.path) as root:
            if not _is_repository(root):
                raise Refused(409, "not_git_repo", "This project is not a git repository.")
            branch, commit = _commit(root, user, message, wanted)
        try:
            with transaction.atomic():
                GitCommit.objects.create(
                    project=project, client_id=client_id, commit=commit, branch=branch or "", paths=wanted
                )
        except IntegrityError:
            earlier = GitCommit.objects.get(project=project, client_id=client_id)
            return Committed("duplicate", earlier.commit, earlier.branch or None, list(earlier.paths))
    return Committed("committed", commit, branch, wanted)


def _commit(root: int, user: Any, message: str, paths: list[str]) -> tuple[str | None, str]:
    branch, head = _head(root)
    entries = b"".join(_index_line(root, path) for path in paths)
    scratch = Path(tempfile.mkdtemp(prefix="hermesweb-commit-"))
    try:
        index = {"GIT_INDEX_FILE": str(scratch / "index")}
        try:
            if head:
                _git(root, "read-tree", head, extra_env=index)
            else:
                _git(root, "read-tree", "--empty", extra_env=index)
            _git(root, "update-index", "-z", "--index-info", stdin=entries, extra_env=index)
            tree = _git(root, "write-tree", extra_env=index).decode().strip()
            before = _git(root, "rev-parse", f"{head}^{{tree}}").decode().strip() if head else None
        except GitError as exc:
            raise Refused(409, "git_busy", f"git refused: {exc}") from None
        if tree == before or (before is None and not _tree_has_entries(root, tree)):
            raise Refused(409, "nothing_to_commit", "Those files are as the last commit has them.")
        name, email = author_of(user)
        who = {
            "GIT_AUTHOR_NAME": name,
            "GIT_AUTHOR_EMAIL": email,
            "GIT_COMMITTER_NAME": name,
            "GIT_COMMITTER_EMAIL": email,
        }
        try:
            parents = ["-p", head] if head else []
            commit = _git(root, "commit-tree", tree, *parents, stdin=message.encode(), extra_env=who)
            commit_id = commit.decode().strip()
            # Moved only from the HEAD the tree was built on: a commit made meanwhile is not lost.
            _git(root, "update-ref", "-m", "hermesweb: commit", "HEAD", commit_id, head or ZERO)
        except GitError as exc:
            raise Refused(409, "git_busy", f"The branch moved or git refused: {exc}") from None
        # The repository's own index follows for these paths, as `git commit -- <paths>` does.
        # Its index locked by someone's git: status shows them staged back, nothing is lost.
        with contextlib.suppress(GitError, OSError):
            _update_index(root, entries, scratch)
        return branch, commit_id
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        _give_back(root)


def _update_index(root: int, entries: bytes, scratch: Path) -> None:
    """Apply `entries` to the repository's own index without git reading the working tree.

    git, writing an index, re-reads "racily clean" files (changed in the second the index was
    last written) through the repository's filter drivers. So the index is updated in a copy
    whose time lies far ahead (no entry is racy against it), then put in place under git's own
    lock, `.git/index.lock`, only if the index did not change meanwhile.
    """
    git_dir = _open_git_dir(root)
    try:
        try:
            fd = os.open("index", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=git_dir)
        except FileNotFoundError:
            return  # no index yet: git makes one from HEAD when it needs it
        with os.fdopen(fd, "rb") as handle:
            before = handle.read()
        copy = scratch / "real-index"
        copy.write_bytes(before)
        os.utime(copy, (FAR_AHEAD, FAR_AHEAD))
        _git(
            root, "update-index", "-z", "--index-info", stdin=entries, extra_env={"GIT_INDEX_FILE": str(copy)}
        )
        after = copy.read_bytes()
        lock = os.open(
            "index.lock",
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
            dir_fd=git_dir,
        )
        try:
            with os.fdopen(lock, "wb") as handle:
                handle.write(after)
            uid, gid = fs.owner_of(root)
            if os.geteuid() == 0:
                os.chown("index.lock", uid, gid, dir_fd=git_dir, follow_symlinks=False)
            fd = os.open("index", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=git_dir)
            with os.fdopen(fd, "rb") as handle:
                unchanged = handle.read() == before
            if unchanged:
                os.rename("index.lock", "index", src_dir_fd=git_dir, dst_dir_fd=git_dir)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink("index.lock", dir_fd=git_dir)
    finally:
        os.close(git_dir)


def _give_back(root: int) -> None:
    """What git wrote into the repository (objects, index, refs, logs) to the project's owner."""
    uid, gid = fs.owner_of(root)
    if os.geteuid() != 0 or uid == 0:
        return
    try:
        git_dir = _open_git_dir(root)
    except fs.Outside:
        return
    try:
        give_tree(git_dir, uid, gid)
        if GIT_DIR.get() != ".git":  # a worktree's commit wrote the main repository's objects and refs
            with fs.project_root(Path(GIT_DIR.get()).parent.parent) as common:
                give_tree(common, uid, gid)
    except OSError as exc:
        log.warning("handing %s's repository back to its owner: %s", uid, exc)
    finally:
        os.close(git_dir)


def _tree_has_entries(root: int, tree: str) -> bool:
    return bool(_git(root, "ls-tree", tree).strip())


def _index_line(root: int, path: str) -> bytes:
    """The `update-index --index-info` line giving `path` its state on disk (or removing it)."""
    parts = fs.parts_of(path)
    try:
        parent = fs.open_dir(root, parts[:-1])
    except fs.Outside:
        return _removal(path)
    try:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISDIR(os.lstat(parts[-1], dir_fd=parent).st_mode):
                raise Refused(422, "not_a_file", f"{path!r} is not a file.", {"path": path})
    finally:
        os.close(parent)
    found = _read_entry(root, path)
    if found is None:
        return _removal(path)
    mode, data = found
    blob = _git(root, "hash-object", "-w", "--no-filters", "--stdin", stdin=data).decode().strip()
    return f"{mode} {blob}\t{path}".encode() + b"\x00"


def _removal(path: str) -> bytes:
    return f"0 {ZERO}\t{path}".encode() + b"\x00"
