"""WebSocket routes (docs/live-delivery.md)."""

from __future__ import annotations

from django.urls import path

from runs.consumers import SessionConsumer

websocket_urlpatterns = [
    path("ws/sessions/<int:session_id>/", SessionConsumer.as_asgi()),
]
