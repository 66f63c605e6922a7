"""Personal API tokens: `Authorization: Bearer <token>`, stored hashed."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta
from functools import lru_cache
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, models
from django.utils import timezone

TOKEN_PREFIX = "hw_"
LAST_USED_RESOLUTION = timedelta(minutes=1)


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    digest = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(max_length=12, editable=False, help_text="First characters, to recognise it.")
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"

    @classmethod
    def issue(cls, user: models.Model, name: str = "") -> tuple[ApiToken, str]:
        """Create a token; the raw value is returned once and never stored."""
        raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(user=user, name=name, digest=hash_token(raw), prefix=raw[:10])
        return token, raw

    @classmethod
    def revoke_all(cls, user_id: Any) -> int:
        """Revoke every token of the user still in force; how many."""
        return cls.objects.filter(user_id=user_id, revoked_at__isnull=True).update(revoked_at=timezone.now())

    @classmethod
    def user_for(cls, raw: str) -> Any | None:
        """The active user whose unrevoked token `raw` is, or None; notes the token's use.

        One raw read of the user and the token together: every API call asks this first, and
        the ORM's query building would be most of its cost. `last_used_at` is there to spot
        unused tokens, so it is written at most once per LAST_USED_RESOLUTION, not a commit
        on every call.
        """
        now = timezone.now()
        stale_before = connection.ops.adapt_datetimefield_value(now - LAST_USED_RESOLUTION)
        found = list(get_user_model().objects.raw(_user_for_statement(), [stale_before, hash_token(raw)]))
        if not found:
            return None
        user = found[0]
        if user.token_stale:
            cls.objects.filter(pk=user.token_id).update(last_used_at=now)
        return user


@lru_cache(maxsize=1)
def _user_for_statement() -> str:
    # A token authenticates while it is not revoked and its user is active.
    quote = connection.ops.quote_name
    user, token = quote(get_user_model()._meta.db_table), quote(ApiToken._meta.db_table)
    return (
        "SELECT u.*, t.id AS token_id, (t.last_used_at IS NULL OR t.last_used_at < %s) AS token_stale "
        f"FROM {user} u JOIN {token} t ON t.user_id = u.id "
        "WHERE t.digest = %s AND t.revoked_at IS NULL AND u.is_active"
    )


class OpenSocket(models.Model):
    """A WebSocket a web process holds open: the per-user cap counts these rows, whichever process
    holds them (runs/live/socket_quota.py). Each process refreshes `seen_at` of its own; a row
    not refreshed (its process died) stops counting and is deleted."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    process = models.CharField(max_length=32, help_text="The web process that holds the socket.")
    opened_at = models.DateTimeField(default=timezone.now)
    seen_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        verbose_name = "open socket"

    def __str__(self) -> str:
        return f"socket {self.pk} of user {self.user_id} ({self.process})"
