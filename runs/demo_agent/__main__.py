"""Entry point: ``python -m runs.demo_agent [--home DIR] [--delay SECONDS]`` speaks ACP on stdio."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from acp import run_agent
from acp.core import DEFAULT_STDIO_BUFFER_LIMIT_BYTES
from acp.stdio import stdio_streams

from .agent import DemoAgent
from .store import HOME_ENV, SessionStore, resolve_home
from .transport import DemoTransport

DELAY_ENV = "HERMESWEB_DEMO_DELAY"
STEER_ENV = "HERMESWEB_DEMO_STEER"  # "extension": advertise _session/steering instead of /steer
DEFAULT_DELAY = 0.02


def _delay_from_env() -> float:
    raw = os.environ.get(DELAY_ENV, "")
    try:
        return max(0.0, float(raw)) if raw.strip() else DEFAULT_DELAY
    except ValueError:
        return DEFAULT_DELAY


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runs.demo_agent", description=__doc__)
    parser.add_argument(
        "--home", help=f"where sessions are stored (default: ${HOME_ENV} or ~/.hermesweb-demo-agent)"
    )
    parser.add_argument(
        "--delay", type=float, help=f"seconds per streamed chunk (default: ${DELAY_ENV} or 0.02)"
    )
    args = parser.parse_args(argv)

    # stdout carries JSON-RPC; every log line must go to stderr.
    logging.basicConfig(
        stream=sys.stderr, level=logging.WARNING, format="demo-agent %(levelname)s %(message)s"
    )
    delay = max(0.0, args.delay) if args.delay is not None else _delay_from_env()
    steer = "extension" if os.environ.get(STEER_ENV) == "extension" else "slash"
    agent = DemoAgent(SessionStore(resolve_home(args.home)), delay=delay, steer=steer)
    try:
        # Unstable on: session/resume and session/close are routed only with it.
        asyncio.run(_serve(agent))
    except KeyboardInterrupt:
        return 130
    return 0


async def _serve(agent: DemoAgent) -> None:
    reader, writer = await stdio_streams(limit=DEFAULT_STDIO_BUFFER_LIMIT_BYTES)
    # session/set_model is answered by the transport: the SDK's router has no route for it.
    transport = DemoTransport(reader, writer, {"session/set_model": agent.set_model_request})
    await run_agent(agent, transport, use_unstable_protocol=True)


if __name__ == "__main__":
    sys.exit(main())
