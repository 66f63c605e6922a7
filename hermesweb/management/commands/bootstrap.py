"""`python manage.py bootstrap`: make a fresh install usable in one step.

Ensures a login exists (printing how to sign in) and a demo project on the
default agent. Safe to run on every start: it changes nothing that exists. A generated
password is printed once, when it is made, and kept in `initial-password` (mode 0600)
until that user first signs in.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from hermesweb.private_files import create_private_file, initial_password_file
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
        password_file = initial_password_file()
        user = User.objects.filter(is_superuser=True).order_by("pk").first()
        password = None
        if user is None:
            password = secrets.token_urlsafe(12)
            user = User.objects.create_superuser(username=username, password=password, email="")
            # A file left from an earlier database holds a password no user has any more.
            password_file.unlink(missing_ok=True)
            create_private_file(password_file, password + "\n")
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
        if password is not None:
            # Shown this once; the file goes at the first sign-in (hermesweb.apps).
            self.stdout.write(f"  sign in as {user.get_username()!r} with the password {password}")
            self.stdout.write(f"  (kept in {password_file} until you first sign in)")
        elif password_file.exists():
            self.stdout.write(f"  sign in as {user.get_username()!r} with the password in {password_file}")
        else:
            self.stdout.write(
                f"  sign in as {user.get_username()!r} (python manage.py changepassword to reset)"
            )
