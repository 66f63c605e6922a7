"""The agent sandbox's network: the policy, the filtering proxy and the in-sandbox bridge.

Issue 38 item 2; docs/security.md ("The agent sandbox", Network). The policy
(`runs.runner.netpolicy`) is pure and tested as such; the proxy (`runs.runner.netproxy`) end to
end on loopback against HTTP servers this test starts, with the refused server never reached;
the bridge (`runs.runner.netbridge`) on the host (stdio, exit status, signals, dying with its
parent) and inside a real `bwrap --unshare-net`, where a child that uses the proxy environment
reaches an allowed server, is refused another, and cannot reach the host's loopback directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from ipaddress import ip_address
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from runs import agents
from runs.runner import netproxy
from runs.runner.netbridge import bridge_argv, proxy_env
from runs.runner.netpolicy import Mode, NetworkPolicy, policy_for, private_reason, service_hosts
from runs.runner.netproxy import NetworkProxy, Refusal, private_socket_dir
from runs.runner.sandbox import code_dirs
from tests.support.procs import free_port

needs_bwrap = pytest.mark.skipif(
    agents.bwrap().path is None, reason=f"the sandbox needs bubblewrap: {agents.bwrap().problem}"
)

NO_SERVICES: dict[str, str] = {}


def allowed(policy: NetworkPolicy, host: str, port: int, address: str, *, local: bool = False) -> bool:
    """What the proxy decides for a request of `host:port` that resolved to `address`."""
    return policy.check_address(host, port, ip_address(address), local=local).allowed


# ---------------------------------------------------------------- the policy (pure)


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.8.9.10",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.20",
        "169.254.169.254",  # a cloud's metadata service
        "100.64.0.1",  # CGNAT
        "0.0.0.0",
        "224.0.0.1",
        "255.255.255.255",
        "::1",
        "::",
        "fd00::1",
        "fc00::5",
        "fe80::1",
        "ff02::1",
        "::ffff:127.0.0.1",  # IPv4-mapped
        "::ffff:10.0.0.1",
        "::ffff:0:7f00:1",  # SIIT-translated 127.0.0.1
        "64:ff9b::a00:1",  # NAT64 of 10.0.0.1
        "2002:7f00:1::",  # 6to4 of 127.0.0.1
        "::127.0.0.1",  # the deprecated IPv4-compatible form
    ],
)
def test_the_default_refuses_every_private_address(address: str) -> None:
    policy = policy_for(None, NO_SERVICES)
    assert policy.mode is Mode.PUBLIC and policy.proxied and policy.unshare_net
    assert not allowed(policy, "example.com", 443, address)
    assert private_reason(ip_address(address))


@pytest.mark.parametrize("address", ["8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"])
def test_the_default_allows_public_addresses_but_not_this_hosts_own(address: str) -> None:
    policy = policy_for(None, NO_SERVICES)
    assert allowed(policy, "example.com", 443, address)
    assert not allowed(policy, "example.com", 443, address, local=True)  # the host's public address


def test_the_default_refuses_the_hosts_of_database_url_and_redis_url() -> None:
    environ = {
        "DATABASE_URL": "postgres://hermes:secret@db.internal:5432/hermesweb",
        "REDIS_URL": "redis://:pw@52.4.5.6:6379/0",
    }
    policy = policy_for(None, environ)

    assert not policy.check_name("db.internal", 5432).allowed
    assert not policy.check_name("DB.Internal.", 443).allowed  # any port, any spelling
    assert not allowed(policy, "cache.example", 443, "52.4.5.6")  # by address, whatever the name
    assert not allowed(policy, "x.example", 443, "::ffff:52.4.5.6")
    # The names' addresses, once the proxy resolved them (`NetworkProxy.start`).
    resolved = policy.with_denied_addresses([ip_address("34.1.2.3")])
    assert allowed(policy, "x.example", 443, "34.1.2.3")
    assert not allowed(resolved, "x.example", 443, "34.1.2.3")


def test_the_service_hosts_are_read_from_every_form_of_url() -> None:
    environ = {
        "DATABASE_URL": "postgres://u@[fd00::5]:5432,Replica.Example.:5433/db?host=other.example",
        "REDIS_URL": "unix:///run/redis/redis.sock",
    }
    assert service_hosts(environ) == ["fd00::5", "replica.example", "other.example"]
    assert service_hosts({"DATABASE_URL": "postgres://%2Fvar%2Frun%2Fpostgresql/db"}) == []
    assert service_hosts({"DATABASE_URL": "sqlite:///var/db.sqlite3"}) == []


def test_all_is_no_filter_and_keeps_the_hosts_network() -> None:
    policy = policy_for("all", {"DATABASE_URL": "postgres://127.0.0.1/db"})
    assert policy.mode is Mode.ALL and not policy.unshare_net
    assert allowed(policy, "127.0.0.1", 5432, "127.0.0.1", local=True)


def test_an_empty_list_is_no_network_at_all() -> None:
    policy = policy_for([], NO_SERVICES)
    assert policy.mode is Mode.NONE and policy.unshare_net and not policy.proxied
    assert not policy.check_name("example.com", 443).allowed
    assert not allowed(policy, "example.com", 443, "8.8.8.8")


LISTED = [
    "api.example.com",
    "*.models.example:8443",
    "127.0.0.1:8765",
    "[::1]:8766",
    "gpu.lan:9000",
]


def test_a_list_allows_exactly_its_entries() -> None:
    policy = policy_for(LISTED, NO_SERVICES)
    assert policy.mode is Mode.LISTED and policy.proxied

    # A name without a port: any port; not its neighbours.
    assert allowed(policy, "api.example.com", 443, "93.184.215.14")
    assert allowed(policy, "api.example.com", 80, "93.184.215.14")
    assert not policy.check_name("example.com", 443).allowed
    assert not policy.check_name("evil.api.example.com", 443).allowed
    # A wildcard: any name below the domain, on its port only; not the domain itself.
    assert allowed(policy, "eu.models.example", 8443, "93.184.215.14")
    assert allowed(policy, "a.b.models.example", 8443, "93.184.215.14")
    assert not policy.check_name("eu.models.example", 443).allowed
    assert not policy.check_name("models.example", 8443).allowed
    # An address: that address and port, however it is written.
    assert allowed(policy, "127.0.0.1", 8765, "127.0.0.1")
    assert allowed(policy, "::ffff:127.0.0.1", 8765, "::ffff:127.0.0.1")
    assert not policy.check_name("127.0.0.1", 5432).allowed  # the database beside the model server
    assert allowed(policy, "::1", 8766, "::1")
    assert not policy.check_name("::1", 8765).allowed
    # Named, not resolved into: `localhost` is not the listed 127.0.0.1.
    assert not policy.check_name("localhost", 8765).allowed
    assert not policy.check_name("unlisted.example", 443).allowed


def test_a_name_listed_exactly_may_be_private_and_a_wildcard_may_not() -> None:
    policy = policy_for(LISTED, NO_SERVICES)
    assert allowed(policy, "gpu.lan", 9000, "192.168.1.50")  # the operator named it
    assert allowed(policy, "api.example.com", 443, "10.0.0.7", local=True)
    # DNS rebinding under a wildcard: a name the agent's side controls resolving to loopback.
    assert not allowed(policy, "rebind.models.example", 8443, "127.0.0.1")
    assert not allowed(policy, "rebind.models.example", 8443, "93.184.215.14", local=True)


def test_a_wildcard_does_not_cover_the_services_hosts_but_an_exact_entry_does() -> None:
    environ = {"DATABASE_URL": "postgres://db.models.example:5432/db"}
    assert not policy_for(["*.models.example"], environ).check_name("db.models.example", 5432).allowed
    assert policy_for(["db.models.example:5432"], environ).check_name("db.models.example", 5432).allowed


@pytest.mark.parametrize(
    "network, error",
    [
        ("none", 'must be "all" or a list'),
        ({"host": "x"}, 'must be "all" or a list'),
        ([5], "is not a"),
        ([""], "is not a"),
        (["::1:8765"], "IPv6 address as [address]"),
        (["[::1"], "IPv6 address as [address]"),
        (["[::1]8765"], "IPv6 address as [address]"),
        (["[127.0.0.1]:80"], "is not an IPv6 address"),
        (["example.com:0"], "from 1 to 65535"),
        (["example.com:99999"], "from 1 to 65535"),
        (["example.com:http"], "from 1 to 65535"),
        (["exa mple.com"], "is not a host name"),
        (["*"], 'network = "all"'),
        (["*.com.*"], "is not a host name"),
        (["127.1"], "is not a host name"),  # resolvers read it as 127.0.0.1
        (["bücher.example"], "is not a host name"),  # punycode, please
    ],
)
def test_a_bad_network_value_stops_the_agents_file_with_a_clear_error(network: Any, error: str) -> None:
    environ = {"HERMESWEB_AGENTS": json.dumps({"x": {"command": "x", "network": network}})}
    with pytest.raises(ImproperlyConfigured, match=r"agent 'x' 'network'") as caught:
        agents.load_agents(Path("/nonexistent"), environ=environ)
    assert error in str(caught.value)


def test_the_network_key_is_read_from_the_agents_file(tmp_path: Path) -> None:
    path = tmp_path / "agents.toml"
    path.write_text(
        "[agents.local]\ncommand = 'x'\nnetwork = ['127.0.0.1:8765', '[::1]:8765', '*.example.com']\n"
        "[agents.offline]\ncommand = 'x'\nnetwork = []\n"
        "[agents.open]\ncommand = 'x'\nnetwork = 'all'\n"
        "[agents.default]\ncommand = 'x'\n"
    )
    specs = agents.load_agents(tmp_path, environ={"HERMESWEB_AGENTS_FILE": str(path)})
    assert specs["local"].network == ("127.0.0.1:8765", "[::1]:8765", "*.example.com")
    assert specs["offline"].network == ()
    assert specs["open"].network == "all"
    assert specs["default"].network is None
    assert policy_for(specs["local"].network, NO_SERVICES).check_name("::1", 8765).allowed


# ---------------------------------------------------------------- the proxy, end to end on loopback


@dataclass
class Origin:
    """A tiny HTTP server on 127.0.0.1: answers every request with what it received."""

    port: int = 0
    heads: list[str] = field(default_factory=list)
    connections: int = 0
    server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
            self.heads.append(head)
            body = json.dumps({"line": head.split("\r\n")[0], "head": head}).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def origin() -> AsyncIterator[Origin]:
    server = Origin()
    server.server = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    server.port = server.server.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        server.server.close()
        await server.server.wait_closed()


@contextlib.asynccontextmanager
async def proxy(
    policy: NetworkPolicy, owner: tuple[int, int] | None = None, **options: Any
) -> AsyncIterator[tuple[NetworkProxy, list[Refusal]]]:
    refusals: list[Refusal] = []
    directory = private_socket_dir(owner=owner)
    server = NetworkProxy(
        policy,
        directory / "proxy.sock",
        owner=owner,
        agent="demo",
        project="7",
        on_refused=refusals.append,
        **options,
    )
    await server.start()
    try:
        yield server, refusals
    finally:
        await server.close()
        shutil.rmtree(directory, ignore_errors=True)


@dataclass
class Answer:
    status: int
    head: str
    body: bytes


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    return Answer(int(head.split(" ")[1]), head, await reader.read())


async def ask(server: NetworkProxy, head: str) -> Answer:
    """One request to the proxy's socket; the whole answer (the proxy closes after it)."""
    reader, writer = await asyncio.open_unix_connection(str(server.socket_path))
    try:
        writer.write(head.encode("latin-1"))
        return await read_answer(reader)
    finally:
        writer.close()


async def tunnel(server: NetworkProxy, target: str, request: str) -> tuple[str, Answer | None]:
    """CONNECT `target`; on 200, `request` through the tunnel. (the CONNECT answer's line, answer)"""
    reader, writer = await asyncio.open_unix_connection(str(server.socket_path))
    try:
        writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        if not head.startswith("HTTP/1.1 200 "):
            return head.split("\r\n")[0], None
        writer.write(request.encode())
        return head.split("\r\n")[0], await read_answer(reader)
    finally:
        writer.close()


def run(coro: Awaitable[Any]) -> Any:
    async def bounded() -> Any:
        async with asyncio.timeout(60):
            return await coro

    return asyncio.run(bounded())


def test_connect_and_plain_http_reach_a_listed_server_and_nothing_else() -> None:
    async def scenario() -> None:
        async with origin() as good, origin() as other:
            policy = policy_for([f"127.0.0.1:{good.port}"], NO_SERVICES)
            async with proxy(policy) as (server, refusals):
                line, through = await tunnel(
                    server, f"127.0.0.1:{good.port}", "GET /tunnelled HTTP/1.1\r\nHost: x\r\n\r\n"
                )
                assert line == "HTTP/1.1 200 Connection established"
                assert through is not None and json.loads(through.body)["line"] == "GET /tunnelled HTTP/1.1"

                plain = await ask(
                    server,
                    f"GET http://127.0.0.1:{good.port}/path?q=1 HTTP/1.1\r\nHost: spoofed\r\n"
                    "Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\nX-Kept: yes\r\n"
                    "Connection: keep-alive, X-Hop\r\nX-Hop: gone\r\n\r\n",
                )
                assert plain.status == 200
                seen = json.loads(plain.body)["head"]
                # Origin-form, the target's Host, one request per connection, no proxy headers.
                assert seen.startswith("GET /path?q=1 HTTP/1.1\r\n")
                assert f"Host: 127.0.0.1:{good.port}\r\n" in seen and "spoofed" not in seen
                assert "Connection: close\r\n" in seen and "X-Kept: yes\r\n" in seen
                assert "Proxy-" not in seen and "X-Hop" not in seen and "keep-alive" not in seen

                line, _ = await tunnel(server, f"127.0.0.1:{other.port}", "")
                refused = await ask(server, f"GET http://127.0.0.1:{other.port}/ HTTP/1.1\r\n\r\n")
                assert line.startswith("HTTP/1.1 403 ") and refused.status == 403
                assert b"not in the agent's network list" in refused.body
                assert other.connections == 0  # refused before connecting
                why = "not in the agent's network list"
                assert refusals == [Refusal(f"127.0.0.1:{other.port}", why, agent="demo", project="7")] * 2
                assert server.refused == 2

    run(scenario())


def test_the_default_refuses_loopback_by_address_and_by_a_name_that_resolves_there(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> None:
        async with origin() as local, proxy(policy_for(None, NO_SERVICES)) as (server, refusals):
            for target in (f"127.0.0.1:{local.port}", f"localhost:{local.port}", f"[::1]:{local.port}"):
                line, _ = await tunnel(server, target, "")
                assert line.startswith("HTTP/1.1 403 "), target
            assert local.connections == 0
            assert len(refusals) == 3 and all("is a loopback address" in r.reason for r in refusals)

    with caplog.at_level("WARNING", logger="runs.runner.netproxy"):
        run(scenario())
    assert "refused localhost:" in caplog.text and "agent 'demo' in project 7" in caplog.text


def fake_dns(table: dict[str, list[str]]) -> Callable[[str, int], Awaitable[list[Any]]]:
    async def resolver(host: str, port: int) -> list[Any]:
        if host not in table:
            raise OSError(f"no such name {host}")
        return [ip_address(a) for a in table[host]]

    return resolver


def test_a_public_name_that_resolves_to_a_private_address_is_refused_dns_rebinding() -> None:
    dns = fake_dns({"rebind.example": ["10.0.0.7"], "sneaky.models.example": ["127.0.0.1"]})

    async def scenario() -> None:
        async with origin() as local:
            async with proxy(policy_for(None, NO_SERVICES), resolver=dns) as (server, refusals):
                line, _ = await tunnel(server, "rebind.example:443", "")
                assert line.startswith("HTTP/1.1 403 ")
                assert refusals[-1].reason == "10.0.0.7 is a private address"
            wildcard = policy_for([f"*.models.example:{local.port}"], NO_SERVICES)
            async with proxy(wildcard, resolver=dns) as (server, refusals):
                line, _ = await tunnel(server, f"sneaky.models.example:{local.port}", "")
                assert line.startswith("HTTP/1.1 403 ") and "loopback" in refusals[-1].reason
            assert local.connections == 0
            # The same name listed exactly: the operator's own local server, reached.
            exact = policy_for([f"sneaky.models.example:{local.port}"], NO_SERVICES)
            async with proxy(exact, resolver=dns) as (server, refusals):
                target = f"http://sneaky.models.example:{local.port}/ok"
                answer = await ask(server, f"GET {target} HTTP/1.1\r\n\r\n")
                assert answer.status == 200 and refusals == []

    run(scenario())


def test_a_public_address_is_connected_to_as_resolved_and_the_services_are_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dns = fake_dns({"public.example": ["93.184.215.14"], "db.example": ["52.9.9.9"]})
    dialled: list[str] = []

    async def scenario() -> None:
        async with origin() as local:

            async def open_tcp(address: Any, port: int) -> Any:
                dialled.append(f"{address}:{port}")  # stands in for the internet
                return await asyncio.open_connection("127.0.0.1", local.port)

            monkeypatch.setattr(netproxy, "open_tcp", open_tcp)
            environ = {"DATABASE_URL": "postgres://db.example:5432/x"}
            async with proxy(policy_for(None, environ), resolver=dns) as (server, refusals):
                # The stand-in is this host: caught after connecting (source address = destination).
                answer = await ask(server, "GET http://public.example/first HTTP/1.1\r\n\r\n")
                assert answer.status == 403 and b"93.184.215.14 is an address of this host" in answer.body
                monkeypatch.setattr(netproxy, "connected_locally", lambda writer: False)
                refusals.clear()

                answer = await ask(server, "GET http://public.example/page HTTP/1.1\r\n\r\n")
                assert answer.status == 200 and json.loads(answer.body)["line"] == "GET /page HTTP/1.1"
                # The database's host: by its name, and by the address that name had at start.
                assert (await ask(server, "GET http://db.example/ HTTP/1.1\r\n\r\n")).status == 403
                assert (await ask(server, "GET http://52.9.9.9:5432/ HTTP/1.1\r\n\r\n")).status == 403
                assert [r.target for r in refusals] == ["db.example:80", "52.9.9.9:5432"]
        assert dialled == ["93.184.215.14:80"] * 2

    run(scenario())


def test_bad_requests_get_bounded_answers() -> None:
    async def scenario() -> None:
        policy = policy_for(None, NO_SERVICES)
        async with proxy(policy, max_head_bytes=4096, head_timeout=0.3) as (server, refusals):
            assert (await ask(server, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")).status == 400
            assert (await ask(server, "GET https://example.com/ HTTP/1.1\r\n\r\n")).status == 400
            assert (await ask(server, "CONNECT example.com HTTP/1.1\r\n\r\n")).status == 400
            assert (await ask(server, "CONNECT *.example.com:443 HTTP/1.1\r\n\r\n")).status == 400
            assert (await ask(server, "GET http://u:p@example.com/ HTTP/1.1\r\n\r\n")).status == 400
            assert (await ask(server, "GET http://x/ HTTP/1.1\r\n folded\r\n\r\n")).status == 400
            huge = "GET http://example.com/ HTTP/1.1\r\nX: " + "a" * 8000 + "\r\n\r\n"
            assert (await ask(server, huge)).status == 431
            # A head that never ends: answered once head_timeout passes, the connection closed.
            assert (await ask(server, "GET http://example.com/ HTTP/1.1\r\nX: y")).status == 408
            assert refusals == []

    run(scenario())


def test_a_connect_that_hangs_times_out_with_504(monkeypatch: pytest.MonkeyPatch) -> None:
    async def never(address: Any, port: int) -> Any:
        await asyncio.Event().wait()

    monkeypatch.setattr(netproxy, "open_tcp", never)

    async def scenario() -> None:
        policy = policy_for(["slow.example"], NO_SERVICES)
        dns = fake_dns({"slow.example": ["93.184.215.14"]})
        async with proxy(policy, resolver=dns, connect_timeout=0.2) as (server, _):
            line, _ = await tunnel(server, "slow.example:443", "")
            assert line.startswith("HTTP/1.1 504 ")

    run(scenario())


def test_close_ends_open_tunnels_and_leaves_no_task_or_socket_behind() -> None:
    async def scenario() -> None:
        async with origin() as local:
            policy = policy_for([f"127.0.0.1:{local.port}"], NO_SERVICES)
            async with proxy(policy) as (server, _):
                reader, writer = await asyncio.open_unix_connection(str(server.socket_path))
                writer.write(f"CONNECT 127.0.0.1:{local.port} HTTP/1.1\r\n\r\n".encode())
                assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
                assert len(server.connections) == 1
                running = [t.get_coro().__qualname__ for t in asyncio.all_tasks()]
                assert "NetworkProxy.serve" in running and "relay.<locals>.copy" in running
                await server.close()
                assert await reader.read() == b""  # the tunnel was closed under the agent
                writer.close()
                assert not server.socket_path.exists() and server.connections == set()
                left = [t.get_coro().__qualname__ for t in asyncio.all_tasks() - {asyncio.current_task()}]
                assert not [name for name in left if "serve" in name or "relay" in name], left

    run(scenario())


NOBODY = 65534
# One the unprivileged account can run (the venv's may live in root's 0700 home).
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "python3"


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.isabs(SYSTEM_PYTHON),
    reason="needs root, setpriv and a system python3",
)
def test_only_the_agent_account_can_connect_to_its_proxys_socket() -> None:
    # A root runner's agents (and so their bridges) run as an account of their own (setpriv).
    probe = "import socket, sys\ntry:\n socket.socket(socket.AF_UNIX).connect(sys.argv[1]); print('in')\n"
    probe += "except PermissionError:\n print('refused')\n"

    async def connect_as(uid: int, path: Path) -> str:
        process = await asyncio.create_subprocess_exec(
            "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--",
            SYSTEM_PYTHON, "-I", "-S", "-c", probe, str(path),
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await process.communicate()
        return out.decode().strip()

    async def scenario() -> None:
        async with proxy(policy_for([], NO_SERVICES), owner=(NOBODY, NOBODY)) as (server, _):
            sock, directory = server.socket_path.stat(), server.socket_path.parent.stat()
            assert (sock.st_uid, sock.st_mode & 0o777) == (NOBODY, 0o600)
            assert (directory.st_uid, directory.st_mode & 0o777) == (NOBODY, 0o700)
            assert await connect_as(NOBODY, server.socket_path) == "in"
            assert await connect_as(NOBODY - 1, server.socket_path) == "refused"

    run(scenario())


# ---------------------------------------------------------------- the bridge


def test_the_proxy_environment_points_every_client_at_the_bridge() -> None:
    env = proxy_env(4321)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        assert env[name] == "http://127.0.0.1:4321"
    assert env["NO_PROXY"] == "" and env["no_proxy"] == ""
    argv = bridge_argv("/s/proxy.sock", "/bin/agent", ["--acp"], port=4321, python="/py")
    assert argv[:3] == ["/py", "-I", "-S"] and argv[3].endswith("runs/runner/netbridge.py")
    assert argv[4:] == ["--socket", "/s/proxy.sock", "--port", "4321", "--", "/bin/agent", "--acp"]


# The agent stand-in: echoes a line of stdin to stdout, reports what it could reach, exits 3.
CHILD = r"""
import http.client, json, os, socket, sys, urllib.error, urllib.request
allowed, refused = int(sys.argv[1]), int(sys.argv[2])
out = {"stdin": sys.stdin.readline().strip(), "pid": os.getpid()}
def attempt(name, fn):
    try:
        out[name] = fn()
    except urllib.error.HTTPError as exc:
        out[name] = exc.code
    except OSError as exc:
        out[name] = type(exc).__name__
get = lambda port, path: urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=20)
attempt("allowed", lambda: json.loads(get(allowed, "/plain").read())["line"])
attempt("refused", lambda: get(refused, "/").status)
def tunnelled():
    proxy = urllib.request.getproxies()["https"].rsplit(":", 1)
    conn = http.client.HTTPConnection("127.0.0.1", int(proxy[1]), timeout=20)
    conn.set_tunnel("127.0.0.1", allowed)
    conn.request("GET", "/tunnel")
    return json.loads(conn.getresponse().read())["line"]
attempt("tunnel", tunnelled)
attempt("direct", lambda: socket.create_connection(("127.0.0.1", allowed), timeout=5) and "reached")
print(json.dumps(out), flush=True)
sys.exit(3)
"""


@needs_bwrap
def test_the_bridge_in_a_real_sandbox_reaches_only_what_the_policy_allows() -> None:
    async def scenario() -> None:
        async with origin() as good, origin() as other:
            policy = policy_for([f"127.0.0.1:{good.port}"], NO_SERVICES)
            async with proxy(policy) as (server, refusals):
                directory = str(server.socket_path.parent)
                port = free_port()  # the sandbox's own loopback: any port would do
                argv = [
                    agents.bwrap().path or "bwrap",
                    "--die-with-parent",
                    "--unshare-net",
                    "--unshare-pid",
                    "--new-session",
                    "--cap-drop", "ALL",  # as runs/runner/sandbox.py runs agents
                    "--ro-bind", "/", "/",
                    "--dev", "/dev",
                    "--proc", "/proc",
                    "--tmpfs", "/tmp",
                    # The interpreter and the checkout may live under /tmp (a CI clone): back in.
                    *[a for code in code_dirs(sys.executable) for a in ("--ro-bind", str(code), str(code))],
                    "--bind", directory, directory,
                    "--",
                    *bridge_argv(
                        server.socket_path,
                        sys.executable,
                        ["-c", CHILD, str(good.port), str(other.port)],
                        port=port,
                    ),
                ]  # fmt: skip
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    env={**os.environ, **proxy_env(port)},
                )
                stdout, stderr = await process.communicate(b"over stdin\n")
                assert process.returncode == 3, stderr.decode()  # the agent's own status
                seen = json.loads(stdout)
                assert seen["stdin"] == "over stdin"  # stdio is the agent's, untouched
                assert seen["allowed"] == "GET /plain HTTP/1.1"
                assert seen["tunnel"] == "GET /tunnel HTTP/1.1"
                assert seen["refused"] == 403
                assert seen["direct"] == "ConnectionRefusedError"  # its loopback is its own
                assert other.connections == 0 and good.connections == 2
                assert [r.target for r in refusals] == [f"127.0.0.1:{other.port}"]

    run(scenario())


@contextlib.contextmanager
def bridged(child: str, socket_path: str = "/nonexistent/proxy.sock") -> Iterator[Any]:
    """The bridge on the host (no sandbox), around `python -c child`, its stdio piped."""
    import subprocess

    argv = bridge_argv(socket_path, sys.executable, ["-c", child], port=free_port())
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        for stream in (process.stdin, process.stdout, process.stderr):
            assert stream is not None
            stream.close()


def gone_within(pid: int, seconds: float) -> bool:
    """Wait for process `pid` (not our child) to end: its pidfd turns readable."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], seconds)[0])
    finally:
        os.close(fd)


def test_the_bridge_passes_signals_on_and_exits_as_its_agent_did() -> None:
    child = (
        "import os, signal, sys\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('term', flush=True), sys.exit(5)))\n"
        "print(os.getpid(), flush=True)\n"
        "signal.pause()\n"
    )
    with bridged(child) as process:
        int(process.stdout.readline())  # the agent runs and owns stdout
        process.send_signal(signal.SIGTERM)
        assert process.stdout.readline() == b"term\n"
        assert process.wait(10) == 5
    with bridged("import os, signal; os.kill(os.getpid(), signal.SIGKILL)") as process:
        assert process.wait(10) == -signal.SIGKILL  # died as the agent died


def test_the_agent_dies_with_its_bridge() -> None:
    with bridged("import os, signal\nprint(os.getpid(), flush=True)\nsignal.pause()\n") as process:
        agent = int(process.stdout.readline())
        process.kill()  # SIGKILL: nothing of the bridge runs
        assert process.wait(10) == -signal.SIGKILL
        assert gone_within(agent, 10), "the agent outlived its bridge"
