"""An agent's filtering proxy: HTTP CONNECT and plain HTTP on a Unix socket, one per agent process.

Design note: docs/security.md ("The agent sandbox", Network). The runner runs one `NetworkProxy`
per sandboxed agent process, on a Unix socket in a private directory that is bound into the
agent's sandbox, where runs/runner/netbridge.py makes it a loopback port. For each connection:

1. read the request head (at most `max_head_bytes`, within `head_timeout`): `CONNECT host:port`
   or an absolute-form `GET http://host[:port]/path` (any method);
2. ask the policy (runs/runner/netpolicy.py) about the name, then resolve it once, ask about
   every address it resolved to, and connect only to an allowed one (DNS rebinding: the check
   is on the address connected to, never on the name alone);
3. CONNECT: answer 200 and relay bytes both ways. Plain HTTP: send the head on in origin-form
   with `Connection: close`, then relay: one request per connection, so a client that reuses
   its proxy connection for another host can never send that request to this one's server.

A refusal answers 403, is logged with the agent, the project and the target, and is handed to
`on_refused` (a `Refusal`) for the runner to count per run.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import socket
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from runs.agents import parse_network_entry
from runs.runner.netpolicy import Address, Mode, NetworkPolicy, address_of, normalize_host

logger = logging.getLogger(__name__)

MAX_HEAD_BYTES = 32 * 1024
HEAD_TIMEOUT = 30.0
CONNECT_TIMEOUT = 10.0
MAX_CONNECTIONS = 256
PIPE_CHUNK = 64 * 1024
# Hop-by-hop headers of the agent's request: never sent on (RFC 9110 7.6.1); Host is rewritten
# from the request's target, as a proxy must.
DROPPED_HEADERS = frozenset({"connection", "proxy-connection", "keep-alive", "proxy-authorization", "host"})
TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
REASONS = {
    400: "Bad Request",
    403: "Forbidden",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}

Resolver = Callable[[str, int], Awaitable[list[Address]]]


@dataclass(frozen=True)
class Refusal:
    """A connection the policy refused: what the agent asked for, and why not."""

    target: str  # host:port as asked
    reason: str
    agent: str = ""
    project: str = ""


@dataclass(frozen=True)
class Request:
    """A parsed request head: where it goes and, for plain HTTP, the head to send there."""

    method: str
    host: str  # normalized (netpolicy.normalize_host)
    port: int
    head: bytes = b""  # plain HTTP: origin-form, `Connection: close`; CONNECT: nothing

    @property
    def connect(self) -> bool:
        return self.method == "CONNECT"

    @property
    def target(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


class ProxyError(Exception):
    """An answer other than a refusal: the status and a line of text for the agent."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


def parse_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    """`host[:port]` (`[v6]:port`) of a request; ProxyError 400 for anything else."""
    try:
        host, port = parse_network_entry(authority)
    except ValueError as exc:
        raise ProxyError(400, f"bad target: {exc}") from None
    if host.startswith("*"):
        raise ProxyError(400, f"bad target {authority!r}")
    if port is None and default_port is None:
        raise ProxyError(400, f"CONNECT {authority!r} needs a port")
    return normalize_host(host), port or default_port or 0


def parse_request(head: bytes) -> Request:
    """The request line and headers of `head` (ending in CRLF CRLF); ProxyError 400 when bad."""
    lines = head.decode("latin-1").split("\r\n")[:-2]
    if any(c in line for line in lines for c in "\r\n\0"):
        raise ProxyError(400, "bare CR, LF or NUL in the request head")
    parts = lines[0].split(" ") if lines else []
    if len(parts) != 3 or not TOKEN.fullmatch(parts[0]) or parts[2] not in ("HTTP/1.1", "HTTP/1.0"):
        raise ProxyError(400, "not an HTTP/1.x request line")
    method, target, version = parts
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not TOKEN.fullmatch(name):  # obsolete folding, or no header at all
            raise ProxyError(400, f"bad header line {line[:80]!r}")
        headers.append((name, value.strip()))
    if method == "CONNECT":
        host, port = parse_authority(target, None)
        return Request(method, host, port)
    if target[:7].lower() != "http://":
        raise ProxyError(400, "only CONNECT host:port and absolute http:// targets are proxied")
    split = min((i for i in (target.find("/", 7), target.find("?", 7)) if i >= 0), default=len(target))
    authority, path = target[7:split], target[split:]
    if "@" in authority:
        raise ProxyError(400, "credentials in the target's authority")
    host, port = parse_authority(authority, 80)
    path = "/" + path if not path.startswith("/") else path
    # Headers the agent's Connection header names are hop-by-hop too (RFC 9110 7.6.1).
    dropped = DROPPED_HEADERS | {
        token.strip().lower()
        for name, value in headers
        if name.lower() == "connection"
        for token in value.split(",")
    }
    lines = [f"{method} {path} {version}", f"Host: {authority}"]
    lines += [f"{name}: {value}" for name, value in headers if name.lower() not in dropped]
    lines += ["Connection: close", "", ""]
    return Request(method, host, port, "\r\n".join(lines).encode("latin-1"))


def answer(status: int, text: str) -> bytes:
    body = f"hermesweb proxy: {text}\n".encode()
    return (
        f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\n"
        f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body


async def resolve(host: str, port: int) -> list[Address]:
    """Every address the name `host` resolves to, in order (asked once, by the system's resolver)."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    found: list[Address] = []
    for *_, sockaddr in infos:
        address = address_of(str(sockaddr[0]))
        if address is not None and address not in found:
            found.append(address)
    return found


async def open_tcp(address: Address, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Connect to an address already checked (a literal: asyncio resolves nothing again)."""
    return await asyncio.open_connection(str(address), port)


async def relay(
    a_reader: asyncio.StreamReader,
    a_writer: asyncio.StreamWriter,
    b_reader: asyncio.StreamReader,
    b_writer: asyncio.StreamWriter,
) -> None:
    """Copy a → b and b → a until both directions end, passing each half-close on.

    An error in either direction (a reset, a broken pipe) ends both. Closing is the caller's.
    """

    async def copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        while data := await source.read(PIPE_CHUNK):
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof() and not sink.is_closing():
            sink.write_eof()

    tasks = [asyncio.ensure_future(copy(a_reader, b_writer)), asyncio.ensure_future(copy(b_reader, a_writer))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def close_writer(writer: asyncio.StreamWriter | None) -> None:
    """Close a stream and wait for its socket to go, whatever state the peer left it in."""
    if writer is None:
        return
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


@functools.cache
def nonlocal_bind(family: int) -> bool:
    """Whether this host lets any address be bound (then binding tells nothing about it)."""
    name = "ipv4/ip_nonlocal_bind" if family == socket.AF_INET else "ipv6/ip_nonlocal_bind"
    try:
        return Path(f"/proc/sys/net/{name}").read_text().strip() != "0"
    except OSError:
        return True


def is_local_address(address: Address) -> bool:
    """Whether `address` is one of this host's own: only those can be bound to."""
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    if nonlocal_bind(family):
        return False  # `connected_locally` still catches it, after connecting
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((str(address), 0))
        except OSError:
            return False
    return True


def connected_locally(writer: asyncio.StreamWriter) -> bool:
    """The kernel routed the connection to this host: its source is its destination."""
    sock = writer.get_extra_info("socket")
    try:
        return sock is not None and sock.getsockname()[0] == sock.getpeername()[0]
    except OSError:
        return False


def private_socket_dir(parent: str | Path | None = None, *, owner: tuple[int, int] | None = None) -> Path:
    """A fresh directory (0700; owned by `owner`, the agent account, when given) for one proxy's
    socket, to bind into that agent's sandbox. Keep the path short: a socket's is at most 107 bytes."""
    directory = Path(tempfile.mkdtemp(prefix="hwnet-", dir=parent))
    if owner is not None:
        os.chown(directory, *owner)
    return directory


class NetworkProxy:
    """One agent process's proxy, on `socket_path`; `await start()`, later `await close()`."""

    def __init__(
        self,
        policy: NetworkPolicy,
        socket_path: str | Path,
        *,
        agent: str = "",
        project: str = "",
        on_refused: Callable[[Refusal], None] | None = None,
        resolver: Resolver = resolve,
        connect_timeout: float = CONNECT_TIMEOUT,
        head_timeout: float = HEAD_TIMEOUT,
        max_head_bytes: int = MAX_HEAD_BYTES,
        max_connections: int = MAX_CONNECTIONS,
        owner: tuple[int, int] | None = None,
    ) -> None:
        self.policy = policy
        self.socket_path = Path(socket_path)
        self.agent = agent
        self.project = project
        self.on_refused = on_refused
        self.resolver = resolver
        self.connect_timeout = connect_timeout
        self.head_timeout = head_timeout
        self.max_head_bytes = max_head_bytes
        self.max_connections = max_connections
        self.owner = owner
        self.refused = 0
        self.connections: set[asyncio.Task[None]] = set()
        self.server: asyncio.Server | None = None

    async def start(self) -> None:
        """Listen on `socket_path` (its directory is the caller's: `private_socket_dir`).

        The socket is 0600, owned by `owner` (uid, gid) when given: the agent account the bridge
        runs as (connecting needs write permission on the socket). The service's hosts that
        are names (DATABASE_URL's, REDIS_URL's) are resolved now, so their addresses are refused
        whatever name the agent reaches them by.
        """
        addresses: list[Address] = []
        for name in self.policy.denied_names:
            with contextlib.suppress(OSError, TimeoutError):
                async with asyncio.timeout(self.connect_timeout):
                    addresses += await self.resolver(name, 0)
        self.policy = self.policy.with_denied_addresses(addresses)
        self.server = await asyncio.start_unix_server(
            self.serve, path=str(self.socket_path), limit=self.max_head_bytes
        )
        os.chmod(self.socket_path, 0o600)
        if self.owner is not None:
            os.chown(self.socket_path, *self.owner)

    async def close(self) -> None:
        """Stop listening, end every open connection, remove the socket file."""
        server, self.server = self.server, None
        if server is None:
            return
        server.close()
        for task in list(self.connections):
            task.cancel()
        await asyncio.gather(*self.connections, return_exceptions=True)
        await server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection from the agent: its first request decides where the bytes go."""
        task = asyncio.current_task()
        assert task is not None
        self.connections.add(task)
        upstream: asyncio.StreamWriter | None = None
        try:
            if len(self.connections) > self.max_connections:
                raise ProxyError(503, f"more than {self.max_connections} connections at once")
            request = parse_request(await self.read_head(reader))
            up_reader, upstream = await self.connect(request)
            if request.connect:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                upstream.write(request.head)
            await relay(reader, writer, up_reader, upstream)
        except ProxyError as exc:
            with contextlib.suppress(OSError):
                writer.write(answer(exc.status, str(exc)))
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass  # the agent or the server went away mid-way: nothing left to tell anyone
        finally:
            await close_writer(upstream)
            await close_writer(writer)
            self.connections.discard(task)

    async def read_head(self, reader: asyncio.StreamReader) -> bytes:
        try:
            async with asyncio.timeout(self.head_timeout):
                return await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise ProxyError(431, f"the request head passes {self.max_head_bytes} bytes") from None
        except TimeoutError:
            raise ProxyError(408, "no complete request head in time") from None

    async def connect(self, request: Request) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Resolve, check each address, connect to the first allowed one that answers."""
        verdict = self.policy.check_name(request.host, request.port)
        if not verdict.allowed:
            raise self.refuse(request, verdict.reason)
        literal = address_of(request.host)
        try:
            async with asyncio.timeout(self.connect_timeout):
                addresses = (
                    [literal] if literal is not None else await self.resolver(request.host, request.port)
                )
        except (OSError, TimeoutError) as exc:
            raise ProxyError(502, f"cannot resolve {request.host}: {exc or 'timed out'}") from None
        allowed, refused = [], ""
        check_local = self.policy.mode is not Mode.ALL
        for address in addresses:
            local = check_local and is_local_address(address)
            verdict = self.policy.check_address(request.host, request.port, address, local=local)
            if verdict.allowed:
                allowed.append(address)
            refused = refused or verdict.reason
        if not allowed:
            raise self.refuse(request, refused or f"{request.host} resolves to no address")
        failure: ProxyError | None = None
        for address in allowed:
            try:
                async with asyncio.timeout(self.connect_timeout):
                    up_reader, upstream = await open_tcp(address, request.port)
            except TimeoutError:
                failure = ProxyError(504, f"connecting to {request.target} ({address}) timed out")
                continue
            except OSError as exc:
                failure = ProxyError(502, f"cannot connect to {request.target} ({address}): {exc.strerror}")
                continue
            if check_local and connected_locally(upstream):
                verdict = self.policy.check_address(request.host, request.port, address, local=True)
                if not verdict.allowed:
                    await close_writer(upstream)
                    raise self.refuse(request, verdict.reason)
            return up_reader, upstream
        assert failure is not None
        raise failure

    def refuse(self, request: Request, reason: str) -> ProxyError:
        """Log and report a refusal; the 403 to raise."""
        self.refused += 1
        target = request.target[:300]
        logger.warning(
            "network: refused %s for agent %r in project %s: %s", target, self.agent, self.project, reason
        )
        if self.on_refused is not None:
            try:
                self.on_refused(Refusal(target=target, reason=reason, agent=self.agent, project=self.project))
            except Exception:
                logger.exception("network: the refusal callback failed")
        return ProxyError(403, f"{target} refused: {reason}")
