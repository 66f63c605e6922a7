"""bench/run's targets: each a ratio (or difference) of two figures of the same run, PASS/MISS by
its direction, and the targets table lists only the rows that have one (bench/_support.py)."""

from __future__ import annotations

import math

from bench import _support as S


def test_a_time_target_passes_at_or_under_its_multiple_of_the_ceiling() -> None:
    under = S.ratio_row("fanout", "p99 ÷ raw", 12.5, 10.0, unit="ms", limit=1.25, at_most=True)
    over = S.ratio_row("fanout", "p99 ÷ raw", 18.1, 10.5, unit="ms", limit=1.25, at_most=True)

    assert (under.value, under.result) == (1.25, "PASS")
    assert over.result == "MISS"
    assert over.note == "18.1 ms ÷ 10.5 ms"  # the absolute figures stay, as information


def test_a_rate_target_passes_at_or_over_its_share_of_the_baseline() -> None:
    assert (
        S.ratio_row("replay", "poll ÷ raw", 60.0, 100.0, unit="ev/s", limit=0.5, at_most=False).result
        == "PASS"
    )
    assert (
        S.ratio_row("replay", "poll ÷ raw", 20.0, 100.0, unit="ev/s", limit=0.5, at_most=False).result
        == "MISS"
    )


def test_a_figure_that_was_not_measured_misses() -> None:
    row = S.ratio_row("ttft", "added ÷ floor", math.nan, 4.0, unit="ms", limit=1.2, at_most=True)
    assert row.result == "MISS"
    assert S.ratio_row("ttft", "added ÷ floor", 4.0, 0.0, unit="ms", limit=1.2, at_most=True).result == "MISS"


def test_a_difference_target_is_in_milliseconds() -> None:
    assert S.difference_row("concurrency", "viewer - row", 189.0, 57.0, limit=25.0).result == "MISS"
    assert S.difference_row("concurrency", "viewer - row", 70.0, 57.0, limit=25.0).value == 13.0


def test_rows_survive_the_json_lines_between_processes_with_their_load() -> None:
    row = S.ratio_row("ingest", "writer ÷ raw bulk", 300.0, 60.0, unit="ev/s", limit=0.5, at_most=False)

    again = S.Row.from_dict(row.as_dict())

    assert (again.value, again.result, again.load) == (row.value, "PASS", row.load)


def test_the_targets_table_lists_only_rows_with_a_target() -> None:
    info = S.Row(bench="fanout", figure="p50 emit→receive", value=4.0, unit="ms", higher_is_better=False)
    target = S.ratio_row("fanout", "p99 ÷ raw", 18.1, 10.5, unit="ms", limit=1.25, at_most=True)

    lines = S.targets_table([info, target]).splitlines()

    assert len(lines) == 3  # the head, the rule, one target
    assert "p99 ÷ raw" in lines[2] and "MISS" in lines[2] and "p50" not in "".join(lines)
