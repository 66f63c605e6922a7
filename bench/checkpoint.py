"""A checkpoint's cost (issue 40; docs/workspace.md): the store's snapshot against plain git.

On a generated tree (`--files` files of `--size` bytes, 10,000 files of 10 KB = 100 MB by default):
- the first checkpoint of the tree (every file hashed into a fresh store);
- a checkpoint of the unchanged tree against `git add -A && git write-tree` with a private
  GIT_DIR and its own persistent index on the same tree, alternately, `--samples` times each
  (target: the median ratio ≤ 1.5);
- the storage one checkpoint adds after one line of a 1 MB file changed (loose objects).

Run alone: `python bench/checkpoint.py [--files N] [--size BYTES] [--samples N]`. It uses a data
directory and a tree of its own under a temporary directory, removed at the end. First-token
time with checkpoints on and off is not measured here yet.
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


def make_tree(root: Path, files: int, size: int) -> None:
    per_dir = 100
    for index in range(files):
        directory = root / f"d{index // per_dir}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"f{index % per_dir}.txt").write_bytes(os.urandom(size // 2).hex().encode()[:size])
    lines = b"".join(b"line %07d of a one-megabyte file\n" % i for i in range(30_000))
    (root / "big.txt").write_bytes(lines[: 1024 * 1024])


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def plain_git(git_dir: Path, tree: Path) -> float:
    env = {**os.environ, "GIT_DIR": str(git_dir), "GIT_WORK_TREE": str(tree)}
    started = time.perf_counter()
    subprocess.run(["git", "add", "-A"], env=env, cwd=tree, check=True)
    subprocess.run(["git", "write-tree"], env=env, cwd=tree, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=15)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="hermesweb-bench-checkpoint-"))
    os.environ["HERMESWEB_DATA_DIR"] = str(work / "data")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hermesweb.settings")
    import django

    django.setup()
    from workspace.store import Store

    try:
        tree = work / "tree"
        make_tree(tree, args.files, args.size)
        store = Store(1, tree)
        started = time.perf_counter()
        first = store.snapshot()
        first_seconds = time.perf_counter() - started

        baseline = work / "plain.git"
        subprocess.run(["git", "init", "-q", "--bare", str(baseline)], check=True)
        plain_git(baseline, tree)  # its first add: the index and objects it then keeps
        ours, theirs = [], []
        for _ in range(args.samples):
            started = time.perf_counter()
            assert store.snapshot().tree == first.tree
            ours.append(time.perf_counter() - started)
            theirs.append(plain_git(baseline, tree))

        objects = store.git_dir / "objects"
        before = du(objects)
        with (tree / "big.txt").open("r+b") as handle:
            handle.seek(500_000)
            handle.write(b"CHANGED")
        store.snapshot()
        added = du(objects) - before

        median_ours, median_theirs = statistics.median(ours), statistics.median(theirs)
        print(f"tree: {first.files} files, {first.bytes / 1e6:.1f} MB")
        print(f"first checkpoint: {first_seconds:.2f} s")
        ratio = median_ours / median_theirs
        print(
            f"unchanged: checkpoint {median_ours * 1000:.0f} ms, git add -A && write-tree "
            f"{median_theirs * 1000:.0f} ms (medians of {args.samples}): ratio {ratio:.2f}"
        )
        print(f"storage added by one changed line of a 1 MB file: {added / 1024:.0f} KiB")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
