"""The Redis channel layer, sealed: only a holder of SECRET_KEY can put a message on it.

Live delivery sends the events a notification carries straight to sockets (docs/live-delivery.md),
so whoever can publish to Redis could otherwise write into anyone's open session. Every message
is sealed with channels_redis' own `symmetric_encryption_keys` (Fernet: AES-CBC and an
HMAC-SHA256 over it) under a key derived from SECRET_KEY; a message that does not open under it
is dropped on receipt and counted in the log. Design note: docs/security.md, "The channel layer".
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from typing import Any

from channels_redis.pubsub import RedisPubSubChannelLayer
from cryptography.fernet import InvalidToken
from django.core.exceptions import ImproperlyConfigured

log = logging.getLogger(__name__)

# The key is SECRET_KEY's, for this purpose only: the layer's key says nothing about the others.
KEY_PURPOSE = b"hermesweb.channel-layer.v1"
BACKEND = "hermesweb.channel_layer.SealedPubSubLayer"
# A flood of forgeries is one warning a minute with its count, not a line per message.
REPORT_EVERY_SECONDS = 60.0


def sealing_keys(secret_key: str) -> list[str]:
    """The layer's key list (channels_redis takes several, the first sealing): SECRET_KEY's."""
    return [hmac.new(secret_key.encode(), KEY_PURPOSE, hashlib.sha256).hexdigest()]


def redis_channel_layer(redis_url: str, prefix: str, secret_key: str) -> dict[str, Any]:
    """CHANNEL_LAYERS["default"] for Redis: every process given the same SECRET_KEY hears the others."""
    return {
        "BACKEND": BACKEND,
        "CONFIG": {
            "hosts": [redis_url],
            "prefix": prefix,
            "symmetric_encryption_keys": sealing_keys(secret_key),
        },
    }


class SealedPubSubLayer(RedisPubSubChannelLayer):
    """channels_redis' pubsub layer that refuses to run unsealed and drops what does not open."""

    def __init__(self, *args: Any, symmetric_encryption_keys: list[str] | None = None, **kwargs: Any) -> None:
        if not symmetric_encryption_keys:
            raise ImproperlyConfigured("the Redis channel layer needs its keys (hermesweb.channel_layer)")
        super().__init__(*args, symmetric_encryption_keys=symmetric_encryption_keys, **kwargs)
        self.refused = 0  # messages that failed authentication, since the process started
        self._reported = 0
        self._reported_at: float | None = None

    async def receive(self, channel: str) -> dict[str, Any]:
        # channels_redis takes the message off the channel's queue, then opens it: a forgery is
        # gone by the time it raises, so the next message is the next one to wait for. Dropped
        # here, not by the callers: their retry pauses would let a flood hold up real messages.
        while True:
            try:
                message: dict[str, Any] = await self._get_layer().receive(channel)
                return message
            except InvalidToken:
                self._refuse()

    def _refuse(self) -> None:
        self.refused += 1
        now = time.monotonic()
        if self._reported_at is not None and now - self._reported_at < REPORT_EVERY_SECONDS:
            return
        log.warning(
            "channel layer: %d message(s) failed authentication and were dropped (published without "
            "this SECRET_KEY: a forgery, or a process configured with another SECRET_KEY)",
            self.refused - self._reported,
        )
        self._reported, self._reported_at = self.refused, now
