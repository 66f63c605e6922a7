"""`reap_stale_runs`: interrupt executing runs whose runner is gone (runners do this too)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django.utils import timezone

from runs.models import Run
from runs.runner import leases


class Command(BaseCommand):
    help = (
        "Mark executing runs whose lease expired (or whose runner died on this host) as interrupted, "
        "with a terminal event. Never re-prompts them. --dry-run lists what would be reaped."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--dry-run", action="store_true")

    def handle(self, *args: Any, dry_run: bool, **options: Any) -> None:
        if dry_run:
            stale = list(Run.objects.stale(timezone.now()))
            for run in stale:
                self.stdout.write(
                    f"would interrupt run {run.pk} (session {run.session_id}, lease {run.lease_owner})"
                )
            self.stdout.write(f"{len(stale)} stale run(s)")
            return
        reaped = leases.reap_stale("reap_stale_runs")
        for run_id in reaped:
            self.stdout.write(f"interrupted run {run_id}")
        self.stdout.write(f"{len(reaped)} run(s) interrupted")
