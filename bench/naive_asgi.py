"""The naive Channels baseline for bench/fanout.py: one consumer per socket, one group_send per event.

This is what the Channels tutorial leads to: every socket joins the session's group
on channels_redis' core layer (a Redis list per channel, a Lua script per
group_send), and every event is its own group message that each consumer turns
into one frame. Default layer settings (capacity 100, as a first deployment has
them). No authentication: the baseline is not charged for work hermesweb must do.

Served by daphne: `daphne bench.naive_asgi:application` with REDIS_URL and
HERMESWEB_REDIS_PREFIX set by the benchmark.
"""

from __future__ import annotations

import os
from typing import Any

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hermesweb.settings")
django_asgi_app = get_asgi_application()

import orjson  # noqa: E402
from channels.generic.websocket import AsyncWebsocketConsumer  # noqa: E402
from channels.layers import channel_layers  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels_redis.core import RedisChannelLayer  # noqa: E402
from django.urls import path  # noqa: E402

NAIVE_ALIAS = "bench-naive"


def naive_layer() -> RedisChannelLayer:
    return RedisChannelLayer(
        hosts=[os.environ["REDIS_URL"]], prefix=os.environ.get("HERMESWEB_REDIS_PREFIX", "bench") + "-naive"
    )


# The project's settings configure the pubsub layer; the baseline is the core layer.
channel_layers.set(NAIVE_ALIAS, naive_layer())


class NaiveConsumer(AsyncWebsocketConsumer):
    channel_layer_alias = NAIVE_ALIAS

    async def connect(self) -> None:
        self.group = f"session.{self.scope['url_route']['kwargs']['session_id']}"
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        pass

    async def bench_event(self, message: dict[str, Any]) -> None:
        await self.send(text_data=orjson.dumps({"type": "event", "event": message["event"]}).decode())


application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": URLRouter([path("ws/sessions/<int:session_id>/", NaiveConsumer.as_asgi())]),
    }
)
