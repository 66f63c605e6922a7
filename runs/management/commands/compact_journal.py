"""`compact_journal`: merge the token deltas of finished runs.

What compaction keeps: every non-delta event, untouched, at its seq; each
consecutive group of `token.delta` (or `reasoning.delta`) events of one
segment becomes its first event, carrying the whole text. The transcript
materialized afterwards is identical. Cursors inside a compacted run answer
`cursor_expired`: the client reloads the transcript.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils import timezone

from runs.journal.payloads import DELTA_SEGMENT_KEYS
from runs.models import TERMINAL_STATUSES, JournalEvent, Run


def compact_run(run: Run) -> int:
    """Compact one finished run; returns the number of rows removed."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        if run.status not in TERMINAL_STATUSES or run.compacted_through >= run.last_seq:
            return 0
        removed: list[int] = []
        keep: JournalEvent | None = None
        changed: list[JournalEvent] = []
        for event in JournalEvent.objects.filter(run=run).order_by("seq"):
            key = DELTA_SEGMENT_KEYS.get(event.type)
            same = (
                keep is not None
                and key
                and keep.type == event.type
                and keep.payload.get(key) == event.payload.get(key)
            )
            if same:
                keep.payload["delta"] += event.payload.get("delta", "")
                removed.append(event.pk)
                if keep not in changed:
                    changed.append(keep)
            else:
                keep = event if key else None
        for event in changed:
            # The text stored at write time spells the old payload: readers spell the new one.
            event.envelope_json = None
            event.save(update_fields=["payload", "envelope_json"])
        JournalEvent.objects.filter(pk__in=removed).delete()
        Run.objects.filter(pk=run.pk).update(compacted_through=run.last_seq)
        return len(removed)


class Command(BaseCommand):
    help = (
        "Merge the token/reasoning deltas of finished runs into one event per segment. "
        "Non-delta events are kept as they are; the materialized transcript does not change; "
        "cursors inside a compacted run answer cursor_expired."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--older-than", type=float, default=7.0, help="Days since the run finished (default 7)."
        )

    def handle(self, *args: Any, older_than: float, **options: Any) -> None:
        horizon = timezone.now() - timedelta(days=older_than)
        runs = Run.objects.filter(status__in=TERMINAL_STATUSES, finished_at__lte=horizon)
        total_runs = total_rows = 0
        for run in runs.iterator():
            removed = compact_run(run)
            if removed:
                total_runs += 1
                total_rows += removed
        self.stdout.write(f"compacted {total_runs} run(s), removed {total_rows} event row(s)")
