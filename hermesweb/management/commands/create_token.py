"""`manage.py create_token USERNAME [--name N]`: print a new personal API token.

The token is shown once; only its hash is stored (hermesweb.models.ApiToken).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from hermesweb.models import ApiToken


class Command(BaseCommand):
    help = "Create a personal API token for USERNAME and print it (it is not shown again)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="A label to recognise the token by, e.g. 'ci'.")

    def handle(self, *args: Any, username: str, name: str, **options: Any) -> None:
        User = get_user_model()
        try:
            user = User.objects.get(**{User.USERNAME_FIELD: username})
        except User.DoesNotExist:
            raise CommandError(f"No user named {username!r}.") from None
        if not user.is_active:
            raise CommandError(f"User {username!r} is inactive; its tokens would not authenticate.")
        if len(name) > ApiToken._meta.get_field("name").max_length:
            raise CommandError("--name is too long (at most 100 characters).")
        _, raw = ApiToken.issue(user, name=name)
        self.stdout.write(raw)
