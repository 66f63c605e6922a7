"""`python manage.py runner`: execute queued runs outside the web process (docs/runner.md)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from runs import placement
from runs.labels import LabelError, parse_labels
from runs.runner.leases import RunnerIdInUse
from runs.runner.process import RunnerProcess


class Command(BaseCommand):
    help = (
        "Run the workbench's runner: claims queued runs, supervises agent processes (ACP over stdio), "
        "journals their events and applies controls. Several runners may run at once. SIGTERM stops "
        "claiming, lets running turns finish (HERMESWEB_SHUTDOWN_GRACE_SECONDS), interrupts the rest."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--id",
            dest="runner_id",
            help="Runner id (default: host-pid-random). A fixed id is reused across restarts; "
            "the previous process's unfinished runs are interrupted when it starts.",
        )
        parser.add_argument(
            "--labels",
            help="Labels this runner offers, e.g. host=build-1,gpu (default: HERMESWEB_RUNNER_LABELS). "
            "It takes only runs whose project and agent require no other label (docs/runner.md, Placement).",
        )

    def handle(
        self, *args: Any, runner_id: str | None = None, labels: str | None = None, **options: Any
    ) -> None:
        if labels is not None:
            try:
                placement.use_labels(parse_labels(labels))
            except LabelError as exc:
                raise CommandError(f"--labels: {exc}") from None
        # What is loaded by now lives as long as the process: kept out of the collector's full
        # passes, which otherwise walk all of it (~100k objects, tens of ms) between two flushes.
        gc.freeze()
        try:
            asyncio.run(RunnerProcess(runner_id).run())
        except RunnerIdInUse as exc:
            raise CommandError(str(exc)) from None
