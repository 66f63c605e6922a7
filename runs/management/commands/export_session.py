"""`export_session SESSION_ID`: the materialized transcript as Markdown or JSON."""

from __future__ import annotations

from typing import Any

import orjson
from django.core.management.base import BaseCommand, CommandError

from projects.models import Session
from runs.export import session_json, session_markdown


class Command(BaseCommand):
    help = "Print a session's transcript, materialized from the journal, as Markdown or JSON."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("session_id", type=int)
        parser.add_argument("--format", choices=["markdown", "json"], default="markdown")

    def handle(self, *args: Any, session_id: int, format: str, **options: Any) -> None:
        session = Session.objects.select_related("project").filter(pk=session_id).first()
        if session is None:
            raise CommandError(f"session {session_id} does not exist")
        if format == "json":
            self.stdout.write(orjson.dumps(session_json(session), option=orjson.OPT_INDENT_2).decode())
        else:
            self.stdout.write(session_markdown(session), ending="")
