"""`replay_journal RUN_ID`: print a run's events, or its materialized transcript."""

from __future__ import annotations

import time
from typing import Any

import orjson
from django.core.management.base import BaseCommand, CommandError

from runs.export import item_markdown
from runs.journal import CursorAhead, CursorExpired, read_after
from runs.models import JournalEvent, Run
from runs.transcript import materialize


class Command(BaseCommand):
    help = (
        "Print a run's journal events after a cursor (text or jsonl), or its materialized transcript "
        "(markdown). --follow tails a live run until its terminal event."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("run_id", type=int)
        parser.add_argument(
            "--after-seq", type=int, default=0, help="Exclusive cursor (default 0: from the start)."
        )
        parser.add_argument("--format", choices=["text", "jsonl", "markdown"], default="text")
        parser.add_argument(
            "--follow", action="store_true", help="Keep printing new events until the run ends."
        )
        parser.add_argument("--poll", type=float, default=0.2, help="Seconds between reads with --follow.")

    def handle(
        self, *args: Any, run_id: int, after_seq: int, format: str, follow: bool, poll: float, **o: Any
    ) -> None:
        run = Run.objects.filter(pk=run_id).first()
        if run is None:
            raise CommandError(f"run {run_id} does not exist")
        if format == "markdown":
            state = materialize(JournalEvent.objects.filter(run=run).order_by("seq"))
            self.stdout.write(
                f"# Run {run.pk} ({run.status})\n\n## Prompt\n\n{run.prompt_text}\n\n## Agent\n"
            )
            for item in state["items"]:
                self.stdout.write(item_markdown(item) + "\n")
            return
        cursor = after_seq
        while True:
            try:
                events = read_after(run, cursor)
            except (CursorAhead, CursorExpired) as exc:
                raise CommandError(f"{exc.code}: {exc}") from None
            for event in events:
                self._print(event, run.session_id, format)
                cursor = event.seq
            run.refresh_from_db()
            if events and cursor < run.last_seq:
                continue  # another page is ready
            if not follow or run.is_terminal:
                return
            time.sleep(poll)

    def _print(self, event: JournalEvent, session_id: int, format: str) -> None:
        if format == "jsonl":
            self.stdout.write(orjson.dumps(event.envelope(session_id)).decode())
            return
        payload = event.payload
        summary = payload.get("delta") or payload.get("text") or payload.get("title") or ""
        if not summary:
            summary = orjson.dumps(payload).decode()
        self.stdout.write(f"{event.seq:>6} {event.type:<20} {summary}".rstrip())
