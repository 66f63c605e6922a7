"""What the agent's network path adds: HTTP through the bridge and the filtering proxy vs direct.

Issue 38 item 2 (docs/security.md, "The agent sandbox", Network). A client process in bubblewrap
makes HTTP requests to a server on the host's loopback, alternately, in rounds:
- proxied: the agent's way, `bwrap --unshare-net` with runs/runner/netbridge.py as its parent
  and the proxy environment; every connection goes client → bridge (the sandbox's loopback) →
  the runner's NetworkProxy (a Unix socket; the policy lists the server) → the server;
- direct (the baseline): the same bwrap without --unshare-net, no proxy environment.
Each request opens a new connection (as an agent's HTTP client that does not keep the proxy's
connection alive, and what every plain-HTTP request through the proxy costs): plain HTTP
(absolute-form through the proxy) and a CONNECT tunnel (what an HTTPS client does) with a small
answer; then one 16 MiB download. Timed inside the client, so the sandbox's start is not counted;
that is measured on its own: a process that prints a line and exits, started in each sandbox
(`--starts` times each way), from spawn to its exit (the bridge's own Python start is the cost).
Without a working bwrap both run on the host (the bridge still listens on its own port).

usage: python bench/network_proxy.py [--requests 300] [--rounds 3] [--starts 20] [--quick] [--json FILE]
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _support as S
from runs import agents
from runs.runner.netbridge import bridge_argv, proxy_env
from runs.runner.netpolicy import policy_for
from runs.runner.netproxy import NetworkProxy, private_socket_dir

BIG = 16 * 1024 * 1024
SMALL = b'{"ok": true, "text": "a small answer, as a model server\'s first chunk"}'
WARM_UP = 10

# The client, in the sandbox: N plain requests, N tunnelled ones, one big download; JSON out.
CLIENT = r"""
import http.client, json, os, sys, time, urllib.request
port, n, warm = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
proxy = os.environ.get("HTTPS_PROXY", "")
def plain():
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/small", timeout=30).read()
def tunnelled():
    if proxy:
        conn = http.client.HTTPConnection("127.0.0.1", int(proxy.rsplit(":", 1)[1]), timeout=30)
        conn.set_tunnel("127.0.0.1", port)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/small")
    body = conn.getresponse().read()
    conn.close()
    return body
out = {}
for name, fn in (("plain", plain), ("tunnel", tunnelled)):
    times = []
    for i in range(n + warm):
        start = time.perf_counter()
        fn()
        if i >= warm:
            times.append(time.perf_counter() - start)
    out[name] = times
start = time.perf_counter()
size = len(urllib.request.urlopen(f"http://127.0.0.1:{port}/big", timeout=60).read())
out["rate"] = size / (time.perf_counter() - start) / 2**20
print(json.dumps(out))
"""


class Servers:
    """The origin server and the proxy, on an event loop of their own in a thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.directory = private_socket_dir()
        self.big = b"x" * BIG
        self.port = 0
        self.proxy: NetworkProxy | None = None
        self.origin: asyncio.Server | None = None

    async def answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            body = self.big if head.split(b" ")[1] == b"/big" else SMALL
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            writer.write(head.encode() + body)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def open(self) -> None:
        self.origin = await asyncio.start_server(self.answer, "127.0.0.1", 0)
        self.port = self.origin.sockets[0].getsockname()[1]
        policy = policy_for([f"127.0.0.1:{self.port}"], {})
        self.proxy = NetworkProxy(policy, self.directory / "proxy.sock", agent="bench", project="bench")
        await self.proxy.start()

    async def shut(self) -> None:
        assert self.proxy is not None and self.origin is not None
        await self.proxy.close()
        self.origin.close()
        await self.origin.wait_closed()

    def __enter__(self) -> Servers:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.open(), self.loop).result(30)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.shut(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        shutil.rmtree(self.directory, ignore_errors=True)


def sandboxed(
    servers: Servers, proxied: bool, command: list[str], bwrap: str | None
) -> tuple[list[str], int]:
    """`command` as an agent would run: proxied behind the bridge in its own network, or not."""
    bridge_port = S.free_port()
    if proxied:
        assert servers.proxy is not None
        command = bridge_argv(servers.proxy.socket_path, command[0], command[1:], port=bridge_port)
    if bwrap:
        directory = str(servers.directory)
        sandbox = [bwrap, "--die-with-parent", "--unshare-pid", "--new-session", "--cap-drop", "ALL"]
        sandbox += ["--unshare-net"] if proxied else []
        sandbox += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        command = [*sandbox, "--bind", directory, directory, "--", *command]
    return command, bridge_port


def run(command: list[str], proxied: bool, bridge_port: int) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(proxy_env(bridge_port) if proxied else {})
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def start_time(servers: Servers, proxied: bool, bwrap: str | None) -> float:
    """Spawn to exit of a process that prints a line: what the bridge adds to an agent's start."""
    command, port = sandboxed(servers, proxied, [sys.executable, "-I", "-c", "print('ready')"], bwrap)
    started = time.perf_counter()
    done = run(command, proxied, port)
    took = time.perf_counter() - started
    if done.stdout != "ready\n":
        raise RuntimeError(f"the start probe failed ({done.returncode}): {done.stderr[-2000:]}")
    return took


def client(servers: Servers, proxied: bool, requests: int, bwrap: str | None) -> dict[str, Any]:
    argv = [sys.executable, "-c", CLIENT, str(servers.port), str(requests), str(WARM_UP)]
    command, port = sandboxed(servers, proxied, argv, bwrap)
    done = run(command, proxied, port)
    if done.returncode != 0:
        raise RuntimeError(f"the client failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def main() -> None:
    parser = S.arguments(__doc__)
    parser.add_argument("--requests", type=int, help="requests of each kind per round (300; 60 quick)")
    parser.add_argument("--rounds", type=int, help="rounds of each, alternately (3; 2 quick)")
    parser.add_argument("--starts", type=int, help="sandbox starts of each, alternately (20; 6 quick)")
    args = parser.parse_args()
    starts = args.starts or (6 if args.quick else 20)
    requests = args.requests or (60 if args.quick else 300)
    rounds = args.rounds or (2 if args.quick else 3)
    bwrap = agents.bwrap().path
    if bwrap is None:
        S.log(f"network proxy: no working bwrap ({agents.bwrap().problem}): both run on the host")
    results: dict[bool, dict[str, list[float]]] = {
        proxied: {"plain": [], "tunnel": [], "rate": [], "start": []} for proxied in (True, False)
    }
    with Servers() as servers:
        S.log(f"network proxy: {starts} sandbox starts each way")
        for _ in range(starts):
            for proxied in (True, False):
                results[proxied]["start"].append(start_time(servers, proxied, bwrap))
        for round_ in range(rounds):
            # Alternate which goes first, so neither always runs on a cooler or a busier box.
            for proxied in (True, False) if round_ % 2 == 0 else (False, True):
                S.log(f"network proxy: round {round_ + 1}, {'proxied' if proxied else 'direct'}")
                out = client(servers, proxied, requests, bwrap)
                for kind in ("plain", "tunnel"):
                    results[proxied][kind] += out[kind]
                results[proxied]["rate"].append(out["rate"])
        refused = servers.proxy.refused if servers.proxy else 0
    if refused:
        raise RuntimeError(f"the proxy refused {refused} connections the policy lists")

    def p50_ms(proxied: bool, kind: str) -> float:
        return S.percentile(results[proxied][kind], 50) * 1000

    where = "in bwrap" if bwrap else "on the host, no bwrap"
    with_bridge, without = p50_ms(True, "start"), p50_ms(False, "start")
    rows = [
        S.Row(
            bench="network-proxy",
            figure="p50 sandbox start to exit of a one-line process: with the bridge",
            value=with_bridge,
            unit="ms",
            higher_is_better=False,
            baseline="without",
            baseline_value=without,
            note=f"+{with_bridge - without:.1f} ms; {starts} starts each way, alternately, {where}",
        )
    ]
    for kind, what in (("plain", "plain HTTP (absolute-form)"), ("tunnel", "a CONNECT tunnel")):
        proxied, direct = p50_ms(True, kind), p50_ms(False, kind)
        rows.append(
            S.Row(
                bench="network-proxy",
                figure=f"p50 request on a new connection, {what}: bridge + proxy",
                value=proxied,
                unit="ms",
                higher_is_better=False,
                baseline="direct",
                baseline_value=direct,
                note=(
                    f"{proxied / direct:.2f}x direct, +{proxied - direct:.2f} ms; p90 "
                    f"{S.percentile(results[True][kind], 90) * 1000:.2f} vs "
                    f"{S.percentile(results[False][kind], 90) * 1000:.2f} ms; "
                    f"{len(results[True][kind])} requests each way, {where}"
                ),
            )
        )
    rows.append(
        S.Row(
            bench="network-proxy",
            figure="a 16 MiB download, plain HTTP: bridge + proxy",
            value=S.percentile(results[True]["rate"], 50),
            unit="MiB/s",
            higher_is_better=True,
            baseline="direct",
            baseline_value=S.percentile(results[False]["rate"], 50),
            note=f"median of {rounds} each way, {where}",
        )
    )
    S.emit(rows, args.json)


if __name__ == "__main__":
    main()
