"""The scheduler's cost and delay (issue 42; docs/automations.md). Not in `bench/run` yet.

- Cost: database queries per minute of one runner's scheduler with `--triggers` (1,000) enabled
  schedules and none due, beside the runner's claim poll (one claim query per
  HERMESWEB_RUNNER_POLL_SECONDS) measured the same way, in one process.
- Delay: `--firings` one-shot schedules planned `--spacing` seconds apart, fired by a real
  runner (`manage.py runner`, the demo agent): planned time → the run's `run.started` event,
  p50/p99, against the scheduler's tick (1 s) and the runner's poll interval.

Run alone: `python bench/automations.py [--db sqlite|postgres] [--triggers N] [--firings N]`.
It uses a data directory (and on PostgreSQL a database) of its own, removed at the end.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _support


def queries_per_tick(call: object, repeat: int = 20) -> float:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        for _ in range(repeat):
            call()  # type: ignore[operator]
    return len(queries) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default="sqlite", choices=["sqlite", "postgres"])
    parser.add_argument("--triggers", type=int, default=1000)
    parser.add_argument("--firings", type=int, default=20)
    parser.add_argument("--spacing", type=float, default=1.3)
    args = parser.parse_args()
    bench = _support.setup(args.db, redis=False, name="automations", HERMESWEB_DEMO_DELAY="0.005")

    from django.conf import settings
    from django.utils import timezone

    from automations import scheduler, services
    from automations.models import Firing, Trigger, TriggerKind
    from projects.models import Workflow
    from runs.models import EventType, JournalEvent
    from runs.runner.claims import claim_run

    owner = _support.make_owner()
    project = _support.make_project(owner)
    workflow = Workflow.objects.create(project=project, name="bench", prompt_template="fast bench")

    # ---- cost: none due
    later = timezone.now() + timedelta(days=1)
    Trigger.objects.bulk_create(
        Trigger(workflow=workflow, kind=TriggerKind.SCHEDULE, cron="0 7 * * *", next_fire_at=later)
        for _ in range(args.triggers)
    )
    per_tick = queries_per_tick(lambda: services.tick(timezone.now(), fired_by="bench"))
    per_claim = queries_per_tick(lambda: claim_run("bench"))
    poll = settings.HERMESWEB_RUNNER_POLL_SECONDS
    print(
        f"scheduler, {args.triggers} enabled triggers, none due: {per_tick:.1f} queries a tick, "
        f"{per_tick * 60 / scheduler.TICK_SECONDS:.0f} a minute"
    )
    print(
        f"baseline, the claim poll every {poll} s: {per_claim:.1f} queries a poll, "
        f"{per_claim * 60 / poll:.0f} a minute"
    )
    Trigger.objects.all().delete()

    # ---- delay: planned time → run.started, through a real runner
    runner = _support.start_runner(bench.env, bench.data_dir, "bench-scheduler")
    try:
        start = timezone.now() + timedelta(seconds=3)
        planned = [start + timedelta(seconds=i * args.spacing) for i in range(args.firings)]
        for at in planned:
            services.do_create_trigger(workflow, kind="schedule", at=at)
        deadline = time.monotonic() + args.firings * args.spacing + 60
        while time.monotonic() < deadline:
            if Firing.objects.filter(run__isnull=False).count() >= args.firings:
                started = {
                    e.run_id: e.created_at for e in JournalEvent.objects.filter(type=EventType.RUN_STARTED)
                }
                if len(started) >= args.firings:
                    break
            time.sleep(0.5)
        delays = []
        for firing in Firing.objects.filter(run__isnull=False):
            event = JournalEvent.objects.filter(run_id=firing.run_id, type=EventType.RUN_STARTED).first()
            if event is not None:
                delays.append((event.created_at - firing.planned_at).total_seconds())
        print(
            f"planned time → run.started over {len(delays)} firings: "
            f"p50 {_support.percentile(delays, 50):.3f} s, p99 {_support.percentile(delays, 99):.3f} s "
            f"(scheduler tick {scheduler.TICK_SECONDS} s, runner poll {poll} s)"
        )
    finally:
        runner.stop()


if __name__ == "__main__":
    main()
