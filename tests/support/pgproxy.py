"""A loopback TCP proxy in front of PostgreSQL that a test can take down, or make lose an answer.

What a runner sees of a database restart or a failover is its connections closing and new
ones refused; what it sees of a server dying between its commit and its answer is a
statement that committed without the answer ever arriving. Neither can be done to the
shared PostgreSQL the whole suite uses, so the runner (or one connection) is pointed here.

The proxy follows the server's side of the protocol message by message (type byte,
length), so `lose_next_answer()` can let the server commit and then cut the connection
before the client has read a byte of the result: everything up to the `ReadyForQuery`
that follows is dropped.
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

# Connection options that keep the protocol readable, so the proxy can tell where answers end.
UNENCRYPTED = {"sslmode": "disable", "gssencmode": "disable"}
# The startup requests whose answer is one untyped byte ('S' or 'N').
_SSL_REQUEST = struct.pack("!ii", 8, 80877103)
_GSSENC_REQUEST = struct.pack("!ii", 8, 80877104)


class PgProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self.answers_lost = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pgproxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._down = False
        self._lose_next: tuple[bytes, bool] | None = None

    def start(self) -> PgProxy:
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def database_url(self, **options: str) -> str:
        """DATABASE_URL of the test database, through this proxy."""
        from urllib.parse import urlencode

        from django.db import connection

        conf = connection.settings_dict
        query = f"?{urlencode(options)}" if options else ""
        return f"postgres://{conf.get('USER') or 'postgres'}@127.0.0.1:{self.port}/{conf['NAME']}{query}"

    def stop(self) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            for link in list(self._links):
                link.close()
            tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self._call(close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def down(self) -> None:
        """Close every connection and refuse new ones, as a restarting server does.

        Returns once the server has ended every backend those connections had: a statement
        already sent runs on (and may commit) after its connection is closed, so until then
        the database can still change behind the outage.
        """

        async def go_down() -> list[int]:
            self._down = True
            ports = [link.server_port for link in self._links]
            for link in list(self._links):
                link.close()
            return ports

        ports = self._call(go_down())
        self._wait_for_backends_to_end(ports)

    def _wait_for_backends_to_end(self, ports: list[int], timeout: float = 30) -> None:
        import psycopg
        from django.db import connection

        conf = connection.settings_dict
        params = {"host": self.upstream[0], "port": self.upstream[1], "dbname": conf["NAME"]}
        with psycopg.connect(**params, user=conf.get("USER") or "postgres", autocommit=True) as conn:
            deadline = time.monotonic() + timeout
            query = "SELECT count(*) FROM pg_stat_activity WHERE client_port = ANY(%s)"
            while (left := conn.execute(query, [ports]).fetchone()[0]) and time.monotonic() < deadline:
                time.sleep(0.01)
        assert not left, f"{left} backends of the proxy's connections outlived the outage by {timeout} s"

    def up(self) -> None:
        self._loop.call_soon_threadsafe(setattr, self, "_down", False)

    @contextmanager
    def outage(self) -> Iterator[None]:
        self.down()
        try:
            yield
        finally:
            self.up()

    def lose_next_answer(self, to: bytes = b"", *, with_rows: bool = False) -> None:
        """Drop the next answer, with its connection, to a query whose text holds `to`.

        With `with_rows`, answers without a row go through and the next one with rows is lost.
        (psycopg prepares a statement run five times and then no longer sends its text.)
        """
        self._loop.call_soon_threadsafe(setattr, self, "_lose_next", (to, with_rows))

    def _call[T](self, coro: asyncio.Future[T] | asyncio.Task[T] | object) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)  # type: ignore[arg-type]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._down:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        if self._down:  # went down while this connection was being opened
            up_writer.close()
            writer.close()
            return
        link = _Link(self, writer, up_writer)
        self._links.add(link)
        try:
            await asyncio.gather(link.client_to_server(reader), link.server_to_client(up_reader))
        finally:
            link.close()
            self._links.discard(link)

    def _take_lose_next(self, query: bytes) -> tuple[bytes, bool] | None:
        lose = self._lose_next
        if lose is None or lose[0] not in query:
            return None
        self._lose_next = None
        return lose


class _Link:
    def __init__(self, proxy: PgProxy, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.client = client
        self.server = server
        self.untyped_bytes = 0  # the answer to an SSL or GSSENC request: one byte, no header
        self.losing: tuple[bytes, bool] | None = None
        self.held = b""  # the answer being lost, in case it turns out to have no rows
        self.rows = False
        self.raw = False
        self.closed = False
        # The server's backend for this link is the one whose client is this local port.
        self.server_port: int = server.get_extra_info("sockname")[1]

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.client.close()
            self.server.close()

    async def client_to_server(self, reader: asyncio.StreamReader) -> None:
        while not self.closed and (data := await reader.read(65536)):
            if data[:8] in (_SSL_REQUEST, _GSSENC_REQUEST):
                self.untyped_bytes += 1
            elif not self.losing and (lose := self.proxy._take_lose_next(data)):
                self.losing = lose  # this query's whole answer, up to its ReadyForQuery
                self.held, self.rows = b"", False
            self.server.write(data)
            await self.server.drain()
        self.close()

    async def server_to_client(self, reader: asyncio.StreamReader) -> None:
        pending = b""
        while not self.closed and (data := await reader.read(65536)):
            pending += data
            forward = b""
            while True:
                if self.raw:
                    forward, pending = forward + pending, b""
                    break
                if self.untyped_bytes and pending:
                    # 'S' or 'G': encrypted from here on, passed through unread (and no answer
                    # can be lost: connect with sslmode=disable for that).
                    self.raw = pending[:1] in (b"S", b"G")
                    forward, pending = forward + pending[:1], pending[1:]
                    self.untyped_bytes -= 1
                    continue
                if len(pending) < 5:
                    break
                kind, length = pending[:1], struct.unpack("!i", pending[1:5])[0]
                if len(pending) < 1 + length:
                    break
                message, pending = pending[: 1 + length], pending[1 + length :]
                if not self.losing:
                    forward += message
                    continue
                self.held += message
                self.rows |= kind == b"D"
                if kind != b"Z":
                    continue
                if self.losing[1] and not self.rows:  # not this one: pass it on, wait for the next
                    self.proxy._lose_next, self.losing = self.losing, None
                    forward, self.held = forward + self.held, b""
                    continue
                # The server is done with the query (committed, in autocommit): the client
                # never hears of it.
                self.proxy.answers_lost += 1
                self.close()
                return
            if forward:
                self.client.write(forward)
                await self.client.drain()
        self.close()
