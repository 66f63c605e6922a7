"""A change's cost: the same benchmark on an earlier commit and on this tree, alternately.

Each round runs the chosen benchmark scripts once on the earlier commit's tree (exported with
`git archive` into a temp dir, nothing in the repository touched) and once on this tree, the
order swapped every round, so both sides share the machine's state. Each figure is then compared
pair by pair: this tree's value against the earlier one's, as a gain (> 1: this tree is better,
whatever the figure's direction), and the median of the pairs is the verdict.

usage: python bench/before_after.py --rev 36acb25 [--to d6be621] [--only ttft,ingest] [--rounds 3] [--quick]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _support as S
from bench.suite import BENCHMARKS


@dataclass(frozen=True)
class Side:
    name: str
    tree: Path


def export(rev: str, into: Path) -> Path:
    """The tree at `rev`, as files: `git archive` leaves the repository's refs and index alone."""
    into.mkdir()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", rev], cwd=S.REPO, check=True, capture_output=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def run_side(side: Side, scripts: list[tuple[str, str, list[str]]], quick: bool, rows_path: Path) -> None:
    for name, script, extra in scripts:
        command = [sys.executable, str(side.tree / "bench" / script), *extra, "--json", str(rows_path)]
        if quick:
            command.append("--quick")
        S.wait_quiet()
        S.log(f"before/after: {side.name}: {name}")
        subprocess.run(command, cwd=side.tree, check=True, stdout=subprocess.DEVNULL)


def gain(row: S.Row, earlier: S.Row) -> float:
    if earlier.value <= 0 or row.value <= 0:
        return float("nan")
    return row.value / earlier.value if row.higher_is_better else earlier.value / row.value


def main() -> None:
    parser = S.arguments(__doc__, quick="each benchmark's smaller and shorter run")
    parser.add_argument("--rev", required=True, help="the earlier commit")
    parser.add_argument("--only", default="ttft,ingest", help="comma-separated benchmark names (bench/run's)")
    parser.add_argument("--to", help="the later commit (default: this working tree as it is)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    chosen = [b for b in BENCHMARKS if b[0] in args.only.split(",")]
    if not chosen:
        raise SystemExit(f"no benchmark named {args.only!r}")
    with tempfile.TemporaryDirectory(prefix="hermesweb-before-") as tmp:
        before = Side(f"at {args.rev}", export(args.rev, Path(tmp) / "before"))
        after = (
            Side(f"at {args.to}", export(args.to, Path(tmp) / "after"))
            if args.to
            else Side("this tree", S.REPO)
        )
        results: dict[str, list[Path]] = {before.name: [], after.name: []}
        for round_ in range(args.rounds):
            order = (before, after) if round_ % 2 == 0 else (after, before)
            for side in order:
                rows_path = Path(tmp) / f"rows-{side is after}-{round_}.jsonl"
                rows_path.touch()
                run_side(side, chosen, args.quick, rows_path)
                results[side.name].append(rows_path)
        report(before.name, after.name, results[before.name], results[after.name])


def report(earlier_name: str, later_name: str, befores: list[Path], afters: list[Path]) -> None:
    pairs: dict[tuple[str, str], list[tuple[S.Row, S.Row]]] = {}
    for before_path, after_path in zip(befores, afters, strict=True):
        earlier = {(r.bench, r.figure): r for r in S.load_rows(str(before_path))}
        for row in S.load_rows(str(after_path)):
            if (row.bench, row.figure) in earlier:
                pairs.setdefault((row.bench, row.figure), []).append((row, earlier[(row.bench, row.figure)]))
    head = [
        "benchmark",
        "figure",
        f"{earlier_name} (median)",
        f"{later_name} (median)",
        "gain per pair",
        "median gain",
    ]
    lines = []
    for (bench, figure), found in pairs.items():
        gains = [gain(row, earlier) for row, earlier in found]
        unit = found[0][0].unit
        lines.append(
            [
                bench,
                figure,
                S.fmt(statistics.median(e.value for _, e in found), unit),
                S.fmt(statistics.median(r.value for r, _ in found), unit),
                " ".join(f"{g:.2f}" for g in gains),
                f"{statistics.median(gains):.2f}x",
            ]
        )
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(head)]
    print(" | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
    print("-+-".join("-" * w for w in widths))
    for line in lines:
        print(" | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)))
    print(f"\ngain > 1: {later_name} is better than {earlier_name} on that figure (< 1: worse).")


if __name__ == "__main__":
    main()
