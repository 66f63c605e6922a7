"""GET /api/health: database, channel layer, runners."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from tests.factories import RunnerFactory

pytestmark = pytest.mark.django_db


def test_health_reports_the_database_and_the_embedded_channel_layer(api: Client, settings: Any) -> None:
    settings.REDIS_URL = ""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

    response = api.get("/api/health")

    assert response.status_code == 200
    body = response.json()
    assert body["ok"] is True
    assert body["database"]["ok"] is True
    assert body["database"]["vendor"] in ("sqlite", "postgresql")
    assert body["channel_layer"] == {
        "ok": True, "backend": "channels.layers.InMemoryChannelLayer", "redis": False, "error": None
    }  # fmt: skip


def test_health_lists_runners_with_their_heartbeat_and_liveness(api: Client, settings: Any) -> None:
    settings.HERMESWEB_LEASE_SECONDS = 15
    RunnerFactory(id="fresh", pid=11)
    RunnerFactory(id="silent", heartbeat_at=timezone.now() - timedelta(minutes=5))
    RunnerFactory(id="stopped", stopped_at=timezone.now())

    runners = {r["id"]: r for r in api.get("/api/health").json()["runners"]}

    assert set(runners) == {"fresh", "silent"}
    assert runners["fresh"]["alive"] is True
    assert runners["fresh"]["pid"] == 11
    assert runners["fresh"]["host"] == "localhost"
    assert runners["fresh"]["last_heartbeat"]
    assert runners["silent"]["alive"] is False


def test_health_is_503_when_redis_does_not_answer(api: Client, settings: Any) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"

    response = api.get("/api/health")

    assert response.status_code == 503
    body = response.json()
    assert body["ok"] is False
    assert body["channel_layer"]["ok"] is False
    assert body["channel_layer"]["redis"] is True
    assert body["channel_layer"]["error"]
    assert body["database"]["ok"] is True


@pytest.mark.redis
def test_health_pings_the_configured_redis(api: Client) -> None:
    body = api.get("/api/health").json()
    assert body["channel_layer"]["redis"] is True
    assert body["channel_layer"]["ok"] is True


def test_health_needs_a_login(anonymous: Client) -> None:
    assert anonymous.get("/api/health").status_code == 401
