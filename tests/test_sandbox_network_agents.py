"""Agents' network, end to end: the demo agent and real Hermes behind the runner's proxy.

Issue 38 item 2; docs/security.md ("The agent sandbox", Network). From inside a real agent's
sandbox, as an attacker's tool call would: PostgreSQL, Redis and the web's port on the host's
loopback are not there directly (the sandbox has a loopback of its own) and are refused by the
proxy; an unlisted host is refused; what the entry lists (the scripted model server) is
reached, so a Hermes turn completes; with `network = []` nothing is reachable. Refusals are
counted on the run. The proxy and its policy alone: tests/test_sandbox_network.py.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from runs.models import RunStatus
from tests import factories
from tests.support.procs import Proc, start_runner
from tests.support.runs import run_of, submit, wait_status
from tests.test_sandbox import Probe, needs_bwrap, tool_output

pytestmark = [needs_bwrap]

PG, REDIS = 5432, 6379


@pytest.fixture
def web_port() -> Iterator[int]:
    """A server on the host's loopback standing for the web (any local service would do)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def through_proxy(name: str, url: str) -> str:
    """curl through the agent's proxy variables: prints `name=<HTTP status>` (000: no answer); for
    https the status is the proxy's answer to CONNECT."""
    status = "%{http_connect}" if url.startswith("https:") else "%{http_code}"
    return f"echo {name}=$(curl -s -o /dev/null -m 5 -w '{status}' '{url}')"


def direct(name: str, port: int) -> str:
    """A plain TCP connection to the host's loopback, as a tool that ignores the proxy would."""
    test = f"timeout 3 bash -c 'echo > /dev/tcp/127.0.0.1/{port}'"
    return f"if {test} 2>/dev/null; then echo {name}=open; else echo {name}=closed; fi"


def probe_script(
    web: int, allowed: int | None = None, unlisted: str = "https://unlisted.example.com/"
) -> str:
    lines = [
        direct("pg_direct", PG),
        direct("redis_direct", REDIS),
        direct("web_direct", web),
        through_proxy("pg", f"http://127.0.0.1:{PG}/"),
        through_proxy("redis", f"http://127.0.0.1:{REDIS}/"),
        through_proxy("web", f"http://127.0.0.1:{web}/"),
        through_proxy("unlisted", unlisted),
        "echo proxy=${HTTPS_PROXY:-none}",
    ]
    if allowed is not None:
        lines.append(through_proxy("allowed", f"http://127.0.0.1:{allowed}/"))
    return "; ".join(lines)


def demo_runner(runners: list[Proc], logs: Path, network: Any) -> Proc:
    spec = dataclasses.asdict(settings.HERMESWEB_AGENTS["demo"])
    spec.pop("name")
    spec["env"] = {**spec["env"], "HERMESWEB_DEMO_DELAY": "0.002", "HERMESWEB_DEMO_SHELL": "1"}
    if network is not None:
        spec["network"] = network
    proc = start_runner(logs, "net", HERMESWEB_AGENTS=json.dumps({"demo": spec}))
    runners.append(proc)
    return proc


REFUSED_EVERYWHERE = {
    "pg_direct": "closed",
    "redis_direct": "closed",
    "web_direct": "closed",
    "pg": "403",
    "redis": "403",
    "web": "403",
    "unlisted": "403",
}


@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_by_default_the_demo_agent_reaches_no_service_on_the_host(
    runners: list[Proc], logs: Path, user: Any, web_port: int
) -> None:
    runner = demo_runner(runners, logs, None)
    session = factories.SessionFactory(project=factories.ProjectFactory(owner=user, agent="demo"))
    # The default lets public addresses out: a name that resolves to none is not reached either.
    script = probe_script(web_port, unlisted="http://10.1.2.3:80/")
    run = run_of(submit(session, f"shell {script}"))
    wait_status(run, RunStatus.COMPLETED, timeout=60, log=runner.log)
    seen = Probe.results(tool_output(run))
    assert {k: seen.get(k) for k in REFUSED_EVERYWHERE} == REFUSED_EVERYWHERE, seen
    assert seen["proxy"].startswith("http://127.0.0.1:")
    run.refresh_from_db()
    assert run.network_refused >= 4  # the four refusals, shown with the run
    assert "refused" in runner.log() and f"127.0.0.1:{PG}" in runner.log()


@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_a_listed_address_is_reached_and_nothing_else(
    runners: list[Proc], logs: Path, user: Any, web_port: int
) -> None:
    runner = demo_runner(runners, logs, [f"127.0.0.1:{web_port}"])
    session = factories.SessionFactory(project=factories.ProjectFactory(owner=user, agent="demo"))
    run = run_of(submit(session, f"shell {probe_script(web_port, allowed=web_port)}"))
    wait_status(run, RunStatus.COMPLETED, timeout=60, log=runner.log)
    seen = Probe.results(tool_output(run))
    assert seen["allowed"] == seen["web"] == "200", seen  # an answer from the listed server
    assert seen["web_direct"] == "closed", seen  # only through the proxy
    for name in ("pg", "redis", "unlisted"):
        assert seen[name] == "403", seen
    assert (seen["pg_direct"], seen["redis_direct"]) == ("closed", "closed"), seen


@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_with_an_empty_network_list_the_agent_has_no_way_out(
    runners: list[Proc], logs: Path, user: Any, web_port: int
) -> None:
    runner = demo_runner(runners, logs, [])
    session = factories.SessionFactory(project=factories.ProjectFactory(owner=user, agent="demo"))
    run = run_of(submit(session, f"shell {probe_script(web_port)}"))
    wait_status(run, RunStatus.COMPLETED, timeout=60, log=runner.log)
    seen = Probe.results(tool_output(run))
    assert seen["proxy"] == "none", seen
    assert {seen[k] for k in ("pg_direct", "redis_direct", "web_direct")} == {"closed"}, seen
    assert {seen[k] for k in ("pg", "redis", "web", "unlisted")} == {"000"}, seen


# ---------------------------------------------------------------- real Hermes


def hermes_runner(runners: list[Proc], logs: Path, settings: Any, config: Any, name: str) -> Proc:
    from runs.agents import _spec

    spec = {**config, "cumulative_usage": True, "steer": "slash"}
    settings.HERMESWEB_AGENTS = {**settings.HERMESWEB_AGENTS, "hermes": _spec("hermes", spec, "test")}
    proc = start_runner(logs, name, HERMESWEB_AGENTS=json.dumps({"hermes": spec}))
    runners.append(proc)
    return proc


@pytest.mark.hermes
@pytest.mark.timeout(240)
@pytest.mark.django_db(transaction=True)
def test_a_hermes_turn_completes_through_the_proxy_while_its_tool_reaches_nothing_else(
    runners: list[Proc],
    logs: Path,
    settings: Any,
    user: Any,
    web_port: int,
    hermes_agent_config: Any,
    scripted_llm: Any,
) -> None:
    from tests.support.scripted_llm import text, tool_call
    from tests.test_sandbox_hermes import tool_results

    runner = hermes_runner(runners, logs, settings, hermes_agent_config, "net-hermes")
    session = factories.SessionFactory(project=factories.ProjectFactory(owner=user, agent="hermes"))
    scripted_llm.enqueue(tool_call("terminal", {"command": probe_script(web_port)}), text("Probed."))
    run = run_of(submit(session, "Probe the network"))
    wait_status(run, RunStatus.COMPLETED, timeout=180, log=runner.log)
    seen = Probe.results(tool_results(scripted_llm.scripted_requests[-1]))
    assert {k: seen.get(k) for k in REFUSED_EVERYWHERE} == REFUSED_EVERYWHERE, seen
    run.refresh_from_db()
    assert run.network_refused >= 4


@pytest.mark.hermes
@pytest.mark.timeout(240)
@pytest.mark.django_db(transaction=True)
def test_hermes_with_no_network_never_reaches_its_model(
    runners: list[Proc], logs: Path, settings: Any, user: Any, hermes_agent_config: Any, scripted_llm: Any
) -> None:
    from tests.support.scripted_llm import text

    config = {**hermes_agent_config, "network": []}
    runner = hermes_runner(runners, logs, settings, config, "net-hermes-none")
    session = factories.SessionFactory(project=factories.ProjectFactory(owner=user, agent="hermes"))
    scripted_llm.enqueue(text("never asked"))
    run = run_of(submit(session, "Hello?"))
    wait_status(run, RunStatus.COMPLETED, RunStatus.FAILED, timeout=200, log=runner.log)
    run.refresh_from_db()
    assert not scripted_llm.scripted_requests  # the model server was never reached
    from tests.support.runs import events

    said = "".join(e.payload.get("text", "") for e in events(run) if e.type == "token.delta")
    # Hermes retries, logs "API call failed after 3 retries. Connection error." to its stderr
    # (the agent's log) and ends the turn without a reply: it reports no error over ACP.
    assert said == "", said
