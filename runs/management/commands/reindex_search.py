"""`reindex_search`: (re)write the search documents of settled runs (docs/search.md)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from runs import search


class Command(BaseCommand):
    help = (
        "Rebuild the search index: write the document of every settled run from its journal "
        "(runs that settled before search existed, or after a crash between a run's commit and "
        "its indexing). --missing: only the runs that have none. Safe while the workbench runs."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--missing", action="store_true", help="Only settled runs with no document.")

    def handle(self, *args: Any, missing: bool, **options: Any) -> None:
        if lost := search.missing_triggers():
            raise CommandError(
                f"the search triggers are missing ({', '.join(lost)}): run `manage.py migrate`, "
                "or recreate them as migration runs/0004 does"
            )
        started = time.monotonic()
        indexed = 0
        for run_id in self._runs(missing):
            indexed += search.index_run(run_id)
            if indexed and indexed % 1000 == 0:
                self.stdout.write(f"… {indexed} run(s)")
        if not missing:
            search.rebuild_backend_index()  # SQLite: the FTS5 table rebuilt from the documents
        self.stdout.write(f"indexed {indexed} run(s) in {time.monotonic() - started:.1f} s")

    @staticmethod
    def _runs(missing: bool) -> Iterator[int]:
        if missing:
            yield from search.missing_run_ids()
            return
        after = 0
        while batch := search.settled_run_ids(after):
            yield from batch
            after = batch[-1]
