"""`remove_unsent_attachments`: delete uploads no message named within a day (runners do this too)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from runs import attachments


class Command(BaseCommand):
    help = (
        "Delete attachments that no message named within --older-than HOURS of their upload "
        "(HERMESWEB_UNSENT_ATTACHMENT_HOURS, 24), files included. Sent ones stay with their session. "
        "--dry-run lists what would go."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--older-than", type=float, metavar="HOURS", help="age in hours (default: the setting)"
        )
        parser.add_argument("--dry-run", action="store_true")

    def handle(self, *args: Any, older_than: float | None, dry_run: bool, **options: Any) -> None:
        hours = settings.HERMESWEB_UNSENT_ATTACHMENT_HOURS if older_than is None else older_than
        age = timedelta(hours=hours)
        if dry_run:
            rows = attachments.unsent_before(age).order_by("pk")
            for row in rows.iterator():
                self.stdout.write(
                    f"would remove attachment {row.pk} ({row.size} bytes, session {row.session_id})"
                )
            self.stdout.write(f"{rows.count()} unsent attachment(s)")
            return
        removed = attachments.remove_unsent(age)
        self.stdout.write(f"{removed} unsent attachment(s) removed")
