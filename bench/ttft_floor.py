"""The floor under time to first token: the same durable steps and hops, with nothing else.

hermesweb's path from "send" to the first token on screen must, by its architecture,
make three durable commits (the run before it is dispatched, the claim before the
agent is prompted, the token before it is published) and cross five process
boundaries besides the agent (client → web, web → runner, runner → web → client, and
each process → the database). This does exactly that with raw drivers and no
framework: a "web" process and a "runner" process, asyncio, psycopg and redis-py, one
statement per commit, Redis pub/sub between them, a line over loopback TCP to and from
the client. What hermesweb adds above this is framework; this itself is the machine.

Run by bench/ttft.py: `python bench/ttft_floor.py web PORT DSN REDIS_URL CHANNEL_PREFIX`
and `... runner DSN REDIS_URL CHANNEL_PREFIX`; the client side is `measure()`.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS floor_run (id bigserial PRIMARY KEY, status text NOT NULL, prompt text,"
    " created_at timestamptz NOT NULL DEFAULT now());"
    "CREATE TABLE IF NOT EXISTS floor_event (id bigserial PRIMARY KEY, run_id bigint NOT NULL"
    " REFERENCES floor_run(id), seq integer NOT NULL, type text NOT NULL, payload jsonb NOT NULL,"
    " created_at timestamptz NOT NULL DEFAULT now(), UNIQUE (run_id, seq));"
    "CREATE INDEX IF NOT EXISTS floor_run_queued ON floor_run (id) WHERE status = 'queued';"
)
SUBMIT = "INSERT INTO floor_run (status, prompt) VALUES ('queued', %s) RETURNING id"
# The claim and its run.started, in one statement (one commit), as the runner's claim is one transaction.
CLAIM = (
    "WITH claimed AS (UPDATE floor_run SET status = 'running' WHERE id = (SELECT id FROM floor_run"
    " WHERE status = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id)"
    " INSERT INTO floor_event (run_id, seq, type, payload)"
    " SELECT id, 1, 'run.started', '{}'::jsonb FROM claimed RETURNING run_id"
)
TOKEN = (
    "INSERT INTO floor_event (run_id, seq, type, payload)"
    " VALUES (%s, 2, 'token.delta', '{\"delta\": \"Hello\"}'::jsonb)"
)


async def web(port: int, dsn: str, redis_url: str, prefix: str) -> None:
    import psycopg
    import redis.asyncio as redis

    db = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    await db.execute(SCHEMA)
    bus = redis.from_url(redis_url)
    events = bus.pubsub()
    await events.subscribe(f"{prefix}:events")
    clients: list[asyncio.StreamWriter] = []

    async def forward() -> None:
        async for message in events.listen():
            if message["type"] == "message":
                for client in clients:
                    client.write(message["data"] + b"\n")

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        clients.append(writer)
        while line := await reader.readline():
            cursor = await db.execute(SUBMIT, [line.decode().strip()])
            row = await cursor.fetchone()
            assert row is not None
            await bus.publish(f"{prefix}:wake", str(row[0]))

    forwarding = asyncio.ensure_future(forward())
    server = await asyncio.start_server(serve, "127.0.0.1", port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()
    forwarding.cancel()


async def runner(dsn: str, redis_url: str, prefix: str) -> None:
    import psycopg
    import redis.asyncio as redis

    db = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    bus = redis.from_url(redis_url)
    wake = bus.pubsub()
    await wake.subscribe(f"{prefix}:wake")
    print("ready", flush=True)
    async for message in wake.listen():
        if message["type"] != "message":
            continue
        cursor = await db.execute(CLAIM)
        row = await cursor.fetchone()
        if row is None:
            continue
        # (The agent is prompted here; its own time is the baseline, not part of the floor.)
        await db.execute(TOKEN, [row[0]])
        await bus.publish(f"{prefix}:events", str(row[0]))


async def measure(port: int, turns: int, pause: float) -> list[float]:
    """Send → the first token's line back, `turns` times after one warm-up, `pause` apart."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    times = []
    for turn in range(turns + 1):
        await asyncio.sleep(pause)
        start = time.perf_counter()
        writer.write(f"turn {turn}\n".encode())
        await writer.drain()
        await reader.readline()
        if turn:
            times.append(time.perf_counter() - start)
    writer.close()
    return times


def main(argv: list[str]) -> None:
    role, *args = argv
    roles: dict[str, Any] = {"web": lambda: web(int(args[0]), *args[1:]), "runner": lambda: runner(*args)}
    asyncio.run(roles[role]())


if __name__ == "__main__":
    main(sys.argv[1:])
