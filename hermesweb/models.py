"""Personal API tokens: `Authorization: Bearer <token>`, stored hashed."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

TOKEN_PREFIX = "hw_"
LAST_USED_RESOLUTION = timedelta(minutes=1)


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


class ApiTokenQuerySet(models.QuerySet["ApiToken"]):
    def active(self) -> ApiTokenQuerySet:
        return self.filter(revoked_at__isnull=True, user__is_active=True)


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, blank=True)
    digest = models.CharField(max_length=64, unique=True, editable=False)
    prefix = models.CharField(max_length=12, editable=False, help_text="First characters, to recognise it.")
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

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
    def authenticate(cls, raw: str) -> ApiToken | None:
        token = cls.objects.active().select_related("user").filter(digest=hash_token(raw)).first()
        if token is not None and token.needs_touch():
            token.last_used_at = timezone.now()
            cls.objects.filter(pk=token.pk).update(last_used_at=token.last_used_at)
        return token

    def needs_touch(self, now: datetime | None = None) -> bool:
        """Whether `last_used_at` is worth a write: it is there to spot unused tokens, and a
        write (a commit) on every API call cost a busy client ~1.5 ms a request."""
        if self.last_used_at is None:
            return True
        return (now or timezone.now()) - self.last_used_at >= LAST_USED_RESOLUTION
