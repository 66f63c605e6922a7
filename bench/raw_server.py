"""The ceiling for bench/fanout.py: a raw `websockets` broadcast server on the same doorbell.

It listens to the same Redis pubsub notifications the runner publishes (the
channel layer hermesweb's settings configure: the journal group and the session's),
encodes each event once and hands it to `websockets.broadcast` for every socket of the
session: no Django, no ASGI, no per-socket task, no authentication. Nothing in one Python process delivers a
journal event to N sockets for less.

usage: python -m bench.raw_server PORT   (REDIS_URL, HERMESWEB_REDIS_PREFIX, SECRET_KEY from the environment)
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections import defaultdict
from typing import Any

import orjson
from websockets.asyncio.server import ServerConnection, broadcast, serve

from hermesweb.channel_layer import SealedPubSubLayer, sealing_keys


async def main(port: int) -> None:
    # The runners seal what they publish (hermesweb.channel_layer): opening it is part of the doorbell.
    layer = SealedPubSubLayer(
        hosts=[os.environ["REDIS_URL"]],
        prefix=os.environ.get("HERMESWEB_REDIS_PREFIX", "hermesweb"),
        symmetric_encryption_keys=sealing_keys(os.environ["SECRET_KEY"]),
    )
    channel = await layer.new_channel()
    # Runners publish to the journal group, one message per group commit (runs.notify).
    await layer.group_add("journal", channel)
    sockets: dict[int, set[ServerConnection]] = defaultdict(set)

    async def handler(ws: ServerConnection) -> None:
        assert ws.request is not None
        session_id = int(ws.request.path.strip("/").split("/")[-1])
        if not sockets[session_id]:
            await layer.group_add(f"session.{session_id}", channel)
        sockets[session_id].add(ws)
        try:
            await ws.wait_closed()
        finally:
            sockets[session_id].discard(ws)

    async def pump() -> None:
        while True:
            message: dict[str, Any] = await layer.receive(channel)
            if message.get("type") == "journal.events":
                items = message.get("runs") or []
            elif message.get("type") == "run.events":
                items = [message]
            else:
                continue
            for item in items:
                targets = sockets.get(int(item["session_id"]))
                if not targets:
                    continue
                for envelope in item.get("events") or []:
                    broadcast(targets, orjson.dumps({"type": "event", "event": envelope}).decode())

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with serve(handler, "127.0.0.1", port, compression=None, max_size=None, ping_interval=None):
        task = asyncio.ensure_future(pump())
        await stop.wait()
        task.cancel()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
