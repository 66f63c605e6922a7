"""WebSocket routes (design note: docs/live-delivery.md)."""

from __future__ import annotations

from django.urls import path

from runs.live.consumer import LiveConsumer, SessionConsumer

websocket_urlpatterns = [
    path("ws/sessions/<int:session_id>/", SessionConsumer.as_asgi()),
    path("ws/live/", LiveConsumer.as_asgi()),
]
