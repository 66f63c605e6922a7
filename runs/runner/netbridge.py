"""The agent's way out: inside its sandbox, a loopback port that leads to its proxy.

Design note: docs/security.md ("The agent sandbox", Network). A sandboxed agent has a network
namespace of its own (only its own loopback); the runner runs a filtering proxy for it
(runs/runner/netproxy.py) on a Unix socket bound into the sandbox. This bridge, started by bwrap
in the agent's place (`bridge_argv`), listens on 127.0.0.1:<port> in the sandbox, forwards each
connection to that socket, and starts the agent as its child, which finds the proxy in its
environment (`proxy_env`). The agent inherits stdin, stdout and stderr: ACP runs over them, so
the bridge never reads or writes them (it lets go of stdin and stdout once the agent runs).
SIGTERM, SIGINT and SIGHUP are passed on; the bridge exits as the agent did, and the agent is
killed if the bridge dies (PR_SET_PDEATHSIG).

Standard library only, and light: it runs by path with `python -I -S` (`bridge_argv`), so
neither the project directory (the agent's to write), the agent's PYTHONPATH nor site-packages
decides what it imports; it imports little (asyncio alone took ~75 ms), as it is one more
Python start per agent process (bench/network_proxy.py). Threads, not an event loop: an agent
opens few connections at once.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence

DEFAULT_PORT = 3128
PROXY_HOST = "127.0.0.1"
RELAYED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PIPE_CHUNK = 64 * 1024
PR_SET_PDEATHSIG = 1
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


def proxy_env(port: int = DEFAULT_PORT) -> dict[str, str]:
    """The variables that send an agent's HTTP(S) clients to its bridge (both spellings).

    NO_PROXY is empty: a listed local model server (`127.0.0.1:8765`) is the host's, reached
    through the proxy; the sandbox's own loopback holds nothing of the host's.
    """
    url = f"http://{PROXY_HOST}:{port}"
    env = {name: url for variable in PROXY_VARIABLES for name in (variable, variable.lower())}
    env.update(NO_PROXY="", no_proxy="")
    return env


def bridge_argv(
    socket_path: str | os.PathLike[str],
    command: str,
    args: Sequence[str] = (),
    *,
    port: int = DEFAULT_PORT,
    python: str = sys.executable,
) -> list[str]:
    """The command line that runs `command args…` behind the bridge (what bwrap is given to run)."""
    script = os.path.realpath(__file__)
    return [
        python,
        "-I",
        "-S",
        script,
        "--socket",
        str(socket_path),
        "--port",
        str(port),
        "--",
        command,
        *args,
    ]


def pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy until the source's EOF, then half-close the sink; an error shuts both down."""
    try:
        while data := source.recv(PIPE_CHUNK):
            sink.sendall(data)
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the other direction's recv


def forward(client: socket.socket, socket_path: str) -> None:
    """One connection of the agent's: relayed to the proxy both ways until both ends close."""
    with client, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as upstream:
        try:
            upstream.connect(socket_path)
        except OSError as exc:
            print(f"netbridge: the proxy at {socket_path} is unreachable: {exc}", file=sys.stderr)
            return
        back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
        back.start()
        pump(client, upstream)
        back.join()


def accept(listener: socket.socket, socket_path: str) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=forward, args=(client, socket_path), daemon=True).start()


def die_with_parent(libc: ctypes.CDLL, parent: int) -> Callable[[], None]:
    """A preexec_fn: the child gets SIGKILL when the bridge dies, even killed outright."""

    def preexec() -> None:
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            os._exit(127)
        if os.getppid() != parent:  # the bridge died before prctl took hold
            os._exit(127)

    return preexec


def run(socket_path: str, port: int, command: Sequence[str]) -> int:
    """Listen, start the agent, wait for it; its return code (negative: killed by that signal)."""
    # Listening before the agent starts: its first request finds the port open.
    listener = socket.create_server((PROXY_HOST, port))
    libc = ctypes.CDLL(None, use_errno=True)  # loaded here: the child only calls into it
    # Forked from the main thread, which lives as long as the bridge: PDEATHSIG follows the
    # thread that forked, not the process.
    process = subprocess.Popen(command, preexec_fn=die_with_parent(libc, os.getpid()))
    for signum in RELAYED_SIGNALS:
        signal.signal(signum, lambda signum, frame: process.send_signal(signum))
    # The agent holds the runner's pipes now; the bridge keeping its copies would delay the
    # runner's EOF on the agent's stdout and let a stray write land in the ACP stream.
    with open(os.devnull, "rb+") as null:
        os.dup2(null.fileno(), 0)
        os.dup2(null.fileno(), 1)
    threading.Thread(target=accept, args=(listener, socket_path), daemon=True).start()
    return process.wait()


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """`--socket PATH --port N -- command args…`: everything after `--` is the agent's."""
    if "--" not in argv:
        raise SystemExit("usage: netbridge --socket PATH [--port N] -- COMMAND [ARGS…]")
    split = list(argv).index("--")
    parser = argparse.ArgumentParser(prog="netbridge", description=__doc__)
    parser.add_argument("--socket", required=True, help="the proxy's Unix socket")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="the loopback port to listen on")
    options = parser.parse_args(argv[:split])
    command = list(argv[split + 1 :])
    if not command:
        raise SystemExit("netbridge: no command after --")
    return options, command


def main(argv: Sequence[str] | None = None) -> int:
    options, command = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        code = run(options.socket, options.port, command)
    except OSError as exc:  # the port taken, the command missing: the agent never started
        print(f"netbridge: {exc}", file=sys.stderr)
        return 127
    if code < 0:
        # Killed by a signal: die of the same one, so the runner sees what the agent did.
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's own disposition is fixed
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code  # a signal whose default is not to die
    return code


if __name__ == "__main__":
    sys.exit(main())
