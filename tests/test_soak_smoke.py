"""bench/soak.py cannot rot: a few seconds of its walk on PostgreSQL + Redis, every check passing.

The soak itself runs for minutes outside CI (bench/README.md, "The soak"); this runs the same
script, processes and checks with three sessions for ~4 s, as a subprocess on this test's
database (already migrated: a new database's migrate was most of the time; flushed after).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.procs import database_url

REPO = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.timeout(150),
    pytest.mark.django_db(transaction=True),  # the soak's processes write to this database
]


def test_a_short_soak_walks_every_action_and_finds_the_journal_and_every_view_exact() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "bench/soak.py",
            *("--minutes", "0.07", "--sessions", "3", "--seed", "11"),
            *("--database-url", database_url()),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=140,
    )

    out = done.stdout
    assert done.returncode == 0, f"soak failed:\n{out[-6000:]}\n{done.stderr[-3000:]}"
    figure = next(line for line in out.splitlines() if line.startswith("FIGURE soak"))
    print(figure)
    assert " lost 0," in figure and " duplicated 0 " in figure and " 0 violations, 5xx 0;" in figure
    # The walk really did something: turns ran and viewers checked their events.
    assert " 0 turns" not in figure and " 0 events checked" not in figure
