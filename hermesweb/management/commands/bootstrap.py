"""`python manage.py bootstrap`: make a fresh install usable in one step.

Ensures a login exists (printing how to sign in) and a demo project on the
default agent. Safe to run on every start: it changes nothing that exists.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from projects.models import Project

DEMO_README = """# Demo project

A scratch working directory for the bundled demo agent. Try prompts such as
`think about it`, `run a tool`, `edit a file`, `approve this`, `make a plan`,
`ask me`, or `slow` (then press Stop).
"""


class Command(BaseCommand):
    help = "Ensure a login and a demo project exist; print how to sign in."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--url", default="http://127.0.0.1:8000/", help="Where the workbench will listen."
        )
        parser.add_argument("--username", default="admin")

    def handle(self, *args: Any, url: str, username: str, **options: Any) -> None:
        User = get_user_model()
        password_file = Path(settings.DATA_DIR) / "initial-password"
        user = User.objects.filter(is_superuser=True).order_by("pk").first()
        if user is None:
            password = secrets.token_urlsafe(12)
            user = User.objects.create_superuser(username=username, password=password, email="")
            password_file.write_text(password + "\n")
            password_file.chmod(0o600)
        if not Project.objects.exists():
            root = Path(settings.HERMESWEB_ALLOWED_ROOTS[0])
            path = root / "demo"
            path.mkdir(parents=True, exist_ok=True)
            readme = path / "README.md"
            if not readme.exists():
                readme.write_text(DEMO_README)
            Project.objects.create(
                name="Demo",
                slug="demo",
                path=str(path.resolve()),
                agent=settings.HERMESWEB_DEFAULT_AGENT,
                owner=user,
            )
        self.stdout.write(f"hermesweb is starting at {url}")
        if password_file.exists():
            self.stdout.write(f"  sign in as {user.get_username()!r} with the password in {password_file}")
            self.stdout.write(f"  ({password_file.read_text().strip()})")
        else:
            self.stdout.write(
                f"  sign in as {user.get_username()!r} (python manage.py changepassword to reset)"
            )
