"""A project's private git object store: snapshots of its tree, the changes between two, blobs.

Design note: docs/workspace.md. Every command runs with GIT_DIR = DATA_DIR/checkpoints/<project
id>.git, in the project (opened without following symlinks; it is the work tree) and with
GIT_INDEX_FILE = a temporary index of its own (seeded from the previous snapshot's, for git's
stat cache), so the project's own `.git`, index, branches and stash are never read nor written,
and a project that is no git repository works the same.
No user or system git configuration is read: hooks, filters and attributes cannot run or convert.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from workspace import conf, fs

BWRAP = shutil.which("bwrap")
TREE_MOUNT = "/mnt"  # where git sees the project, inside its own mount namespace (git())

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
# Unset every attribute that converts bytes on the way in (line endings, filters, ident), so a
# checkpoint holds exactly the bytes on disk; info/attributes outranks the project's .gitattributes.
ATTRIBUTES = "* -text -filter -ident -eol -working-tree-encoding\n"
GIT_TIMEOUT = 300.0
# More changed paths than this are added by one walk of the tree rather than path by path.
MAX_PATHSPECS = 1000
MODE_FILE, MODE_EXECUTABLE, MODE_SYMLINK, MODE_GITLINK = "100644", "100755", "120000", "160000"


class StoreError(Exception):
    """git failed on the store (its message says why)."""


class TooLarge(Exception):
    """The tree is over the files or bytes cap: checkpoints go off for the project."""

    def __init__(self, files: int, size: int) -> None:
        super().__init__(
            f"The project has {files} files and {size} bytes to checkpoint, over the caps "
            f"({conf.max_files()} files, {conf.max_bytes()} bytes): checkpoints are off for it."
        )
        self.files = files
        self.size = size


@dataclass(frozen=True)
class Snapshot:
    tree: str
    files: int
    bytes: int
    not_checkpointed: list[str] = field(default_factory=list)  # over the per-file size cap

    def stats(self) -> dict[str, object]:
        return {"files": self.files, "bytes": self.bytes, "not_checkpointed": self.not_checkpointed}


@dataclass(frozen=True)
class Entry:
    """One path of a tree: its git mode (MODE_*) and blob id."""

    mode: str
    sha: str


@dataclass(frozen=True)
class FileChange:
    path: str
    status: str  # added | modified | deleted
    additions: int
    deletions: int
    binary: bool
    diff: str | None
    truncated: bool


class Store:
    """The object store of one project (at `work_tree`)."""

    def __init__(self, project_id: int, work_tree: str | Path) -> None:
        self.git_dir = conf.store_root() / f"{project_id}.git"
        self.work_tree = Path(work_tree)
        # One seed index per work tree: a project moved elsewhere starts a fresh stat cache.
        tag = hashlib.sha1(str(self.work_tree).encode()).hexdigest()[:12]
        self.base_index = self.git_dir / f"index-{tag}"

    # ------------------------------------------------------------ plumbing

    def _env(self, index: Path | None) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "GIT_DIR": str(self.git_dir),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": "/dev/null",
            "HOME": str(self.git_dir),
            "LC_ALL": "C",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_OPTIONAL_LOCKS": "0",
        }
        if index is not None:
            env["GIT_INDEX_FILE"] = str(index)
        return env

    def git(
        self, *args: str, index: Path | None = None, stdin: bytes | None = None, tree_fd: int | None = None
    ) -> bytes:
        """Run git on the store; with `tree_fd` (the project opened by workspace/fs.py) in it.

        There is no GIT_WORK_TREE: git takes its working directory as the work tree (the store is
        not bare for it) and never looks the project up by name, which a symlink swapped into
        the project's path (a nested project's, by the agent of the one around it) could turn
        into another user's directory. The child enters the opened directory through its own
        /proc/self/fd link, which leads to that directory, not to a name.
        """
        # safe.directory: the project's files may belong to the agent account (docs/security.md).
        argv = [
            "git",
            "-c", "safe.directory=*",
            "-c", f"core.excludesFile={os.devnull}",  # the store's info/exclude is the list
            "-c", "core.autocrlf=false",
            "-c", "core.fileMode=true",
            "-c", "core.symlinks=true",
            "-c", "core.quotePath=false",
            "-c", "core.fsmonitor=false",
            "-c", "gc.auto=0",
            "-c", "index.version=2",  # the layout _indexed reads
            "-c", "feature.manyFiles=false",
            "-c", "core.untrackedCache=true",  # directories unchanged since: not read again
            *args,
        ]  # fmt: skip
        cwd = str(self.git_dir) if tree_fd is None else f"/proc/self/fd/{tree_fd}"
        if tree_fd is not None and BWRAP:
            # git turns its working directory back into a path (getcwd, realpath) and enters it
            # by name, and a swap in that instant led it out. Mounted at a name in a mount
            # namespace of its own, the opened directory has a path nobody else can change.
            mount = ["--dev-bind", "/", "/", "--bind-fd", str(tree_fd), TREE_MOUNT, "--chdir", TREE_MOUNT]
            argv = [BWRAP, *mount, "--", *argv]
        result = subprocess.run(
            argv,
            env=self._env(index),
            cwd=cwd,
            pass_fds=() if tree_fd is None else (tree_fd,),
            input=stdin,
            capture_output=True,
            timeout=GIT_TIMEOUT,
            check=False,
        )
        if result.returncode != 0:
            raise StoreError(f"git {args[0]}: {result.stderr.decode(errors='replace').strip()}")
        return result.stdout

    def ensure(self) -> None:
        """Create the store on first use; keep its exclude list and attributes current."""
        config = self.git_dir / "config"
        if not (self.git_dir / "HEAD").exists():
            self.git_dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            subprocess.run(
                ["git", "init", "--bare", "-q", str(self.git_dir)],
                env={k: v for k, v in self._env(None).items() if k != "GIT_DIR"},
                capture_output=True,
                check=True,
                timeout=GIT_TIMEOUT,
            )
        # Not bare: git takes its working directory (the project, entered by descriptor) as the
        # work tree; the repository's own config is what git's setup reads for this.
        if "bare = true" in config.read_text():
            self.git("config", "--file", str(config), "core.bare", "false")
        info = self.git_dir / "info"
        info.mkdir(exist_ok=True)
        for name, text in (
            ("exclude", "".join(f"{p}\n" for p in conf.exclude())),
            ("attributes", ATTRIBUTES),
        ):
            path = info / name
            # Written when they differ only: this is on every start checkpoint's path.
            if not path.exists() or path.read_text() != text:
                path.write_text(text)

    def exists(self) -> bool:
        return (self.git_dir / "HEAD").exists()

    def remove(self) -> None:
        shutil.rmtree(self.git_dir, ignore_errors=True)

    # ------------------------------------------------------------ snapshots

    def snapshot(self) -> Snapshot:
        """Write the project's tree (what checkpoints keep) into the store; its tree id and counts.

        Raises TooLarge past the files/bytes caps (nothing is written then), StoreError on git's
        failure. The project is only read.
        """
        self.ensure()
        try:
            root = fs.open_root(self.work_tree)
        except (fs.Outside, OSError) as exc:
            raise StoreError(f"the project cannot be opened: {exc}") from None
        index = self.git_dir / f"index-tmp-{uuid.uuid4().hex}"
        try:
            if self.base_index.exists():
                shutil.copyfile(self.base_index, index)
            # A file checkpointed before and ignored since stays in the seed (and so in later
            # checkpoints) until it is deleted: asking git for those cost a second walk each time.
            # What the seed index holds (its recorded sizes), then what changed or is new since
            # (git's walk, in C): only those are looked at one by one, here.
            files, size = self._indexed(index)
            changed = self.git(
                "ls-files", "-z", "-t", "-m", "-o", "-d", "--exclude-standard", index=index, tree_fd=root
            )
            more_files, more_size, skipped = self._measure(changed, root)
            files, size = files + more_files, size + more_size
            if files > conf.max_files() or size > conf.max_bytes():
                raise TooLarge(files, size)
            if skipped:
                gone = b"".join(os.fsencode(p) + b"\0" for p in skipped)
                self.git("update-index", "--force-remove", "-z", "--stdin", index=index, stdin=gone)
            # `add -A` of exactly what changed (literal paths): no second walk of the tree, and
            # nothing at all on an unchanged one.
            over = {os.fsencode(p) for p in skipped}
            paths = {record[2:] for record in changed.split(b"\0") if len(record) > 2} - over
            if len(paths) > MAX_PATHSPECS:  # a first snapshot: the whole tree, but what is over the cap
                pathspecs = b".\0" + b"".join(b":(exclude,literal)" + p + b"\0" for p in sorted(over))
            else:
                pathspecs = b"".join(b":(literal)" + p + b"\0" for p in sorted(paths))
            if pathspecs:
                self.git(
                    "add",
                    "-A",
                    "--pathspec-from-file=-",
                    "--pathspec-file-nul",
                    index=index,
                    stdin=pathspecs,
                    tree_fd=root,
                )
            tree = self.git("write-tree", index=index).decode().strip()
            os.replace(index, self.base_index)
            return Snapshot(tree, files, size, skipped)
        finally:
            index.unlink(missing_ok=True)
            os.close(root)

    def _indexed(self, index: Path) -> tuple[int, int]:
        """Entries and bytes the index records, read from the index file itself (its stat data):
        asking git (`ls-files --debug`) and parsing its text cost as much as the whole `add -A`."""
        try:
            data = index.read_bytes()
        except FileNotFoundError:
            return 0, 0
        if data[:4] != b"DIRC" or int.from_bytes(data[4:8]) not in (2, 3):
            return self._indexed_by_git(index)
        count, size, position = int.from_bytes(data[8:12]), 0, 12
        for _ in range(count):
            size += int.from_bytes(data[position + 36 : position + 40])
            flags = int.from_bytes(data[position + 60 : position + 62])
            fixed = 62 + (2 if flags & 0x4000 else 0)
            length = flags & 0xFFF
            if length == 0xFFF:  # a long name: its NUL says where it ends
                length = data.index(b"\0", position + fixed) - position - fixed
            position += (fixed + length + 8) // 8 * 8
        return count, size

    def _indexed_by_git(self, index: Path) -> tuple[int, int]:
        files = size = 0
        for line in self.git("ls-files", "--debug", index=index).split(b"\n"):
            if line.startswith(b"  size: "):
                files += 1
                size += int(line[8:].split(b"\t", 1)[0])
        return files, size

    def _measure(self, listed: bytes, root: int) -> tuple[int, int, list[str]]:
        """New files (`?`), removed ones (`R`) and changed ones (`C`, counted already: their bytes
        are approximate for the caps) under the per-file cap; the paths over it."""
        files = size = 0
        skipped: list[str] = []
        cap = conf.max_file_bytes()
        for record in set(listed.split(b"\0")):
            if len(record) < 3:
                continue
            tag, raw = record[:1], record[2:]
            if tag == b"R":  # removed (listed as changed too)
                files -= 1
                continue
            try:
                info = os.lstat(raw, dir_fd=root)
            except OSError:
                continue  # deleted: `add -A` records that
            new = tag == b"?"
            if not stat.S_ISREG(info.st_mode):
                files += new
            elif info.st_size > cap:
                skipped.append(raw.decode(errors="surrogateescape"))
                files -= not new  # it leaves the index
            else:
                files += new
                size += info.st_size if new else 0
        return files, size, sorted(skipped)

    # ------------------------------------------------------------ reading trees

    def entries(self, tree: str) -> dict[str, Entry]:
        """Every path of `tree` (recursively) with its mode and blob."""
        out: dict[str, Entry] = {}
        for record in self.git("ls-tree", "-r", "-z", "--full-tree", tree).split(b"\0"):
            if not record:
                continue
            meta, _, path = record.partition(b"\t")
            mode, _, sha = meta.decode().split(" ")
            out[path.decode(errors="surrogateescape")] = Entry(mode, sha)
        return out

    def blobs(self, shas: list[str]) -> dict[str, bytes]:
        """The contents of these blobs, by id, in one `cat-file --batch`."""
        wanted = list(dict.fromkeys(shas))
        if not wanted:
            return {}
        output = self.git("cat-file", "--batch", stdin="".join(f"{s}\n" for s in wanted).encode())
        found: dict[str, bytes] = {}
        position = 0
        for sha in wanted:
            end = output.index(b"\n", position)
            header = output[position:end].decode().split(" ")
            if header[1] == "missing":
                raise StoreError(f"blob {sha} is missing from the store")
            length = int(header[2])
            found[sha] = output[end + 1 : end + 1 + length]
            position = end + 1 + length + 1
        return found

    def changed_paths(self, old: str, new: str) -> list[str]:
        raw = self.git("diff-tree", "-r", "-z", "--no-renames", "--name-only", old, new)
        return [p.decode(errors="surrogateescape") for p in raw.split(b"\0") if p]

    def changes(self, old: str, new: str, *, diff_max: int, total_max: int) -> list[FileChange]:
        """Each file that differs from tree `old` to tree `new`: status, counts, its unified diff.

        A diff longer than `diff_max` is cut (`truncated`); past `total_max` bytes of diffs in
        all, the rest come without one (`diff: null`, `truncated`). Binary files have none.
        """
        raw = self.git("diff-tree", "-r", "-z", "--no-renames", "--raw", old, new).split(b"\0")
        numstat = self.git("diff-tree", "-r", "-z", "--no-renames", "--numstat", old, new).split(b"\0")
        patch = self.git(
            "diff-tree", "-r", "-p", "--no-renames", "--no-color", "--no-ext-diff", "--no-textconv", old, new
        )
        chunks = _split_patch(patch)
        statuses: list[tuple[str, str]] = []
        for i in range(0, len(raw) - 1, 2):
            if not raw[i]:
                continue
            letter = raw[i].decode().split(" ")[-1]
            statuses.append((raw[i + 1].decode(errors="surrogateescape"), letter))
        counts: list[tuple[str, str]] = []
        for record in numstat:
            if record:
                added, deleted, _ = record.decode(errors="surrogateescape").split("\t", 2)
                counts.append((added, deleted))
        out: list[FileChange] = []
        spent = 0
        for index, (path, letter) in enumerate(statuses):
            added, deleted = counts[index] if index < len(counts) else ("0", "0")
            binary = added == "-"
            status = {"A": "added", "D": "deleted"}.get(letter, "modified")
            diff: str | None = None
            truncated = False
            if not binary and index < len(chunks):
                text = chunks[index].decode(errors="replace")
                if spent >= total_max:
                    truncated = True
                else:
                    if len(text) > diff_max:
                        text, truncated = text[:diff_max], True
                    diff = text
                    spent += len(text)
            out.append(
                FileChange(
                    path,
                    status,
                    0 if binary else int(added),
                    0 if binary else int(deleted),
                    binary,
                    diff,
                    truncated,
                )
            )
        return out


def _split_patch(patch: bytes) -> list[bytes]:
    """One chunk per file of `git diff-tree -p` output, in its order (the raw list's order)."""
    chunks: list[list[bytes]] = []
    for line in patch.splitlines(keepends=True):
        if line.startswith(b"diff --git "):
            chunks.append([line])
        elif chunks:
            chunks[-1].append(line)
    return [b"".join(chunk) for chunk in chunks]
