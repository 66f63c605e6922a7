"""Scale-out: two web processes and two runners on PostgreSQL and Redis, started as deploy/ starts them.

The topology test (issue 23): both runners hold runs and queued turns; one client's socket moves
between the two web processes mid-run; one runner is killed (SIGKILL, by pid). Every run ends
exactly once, the killed runner's runs `interrupted` within the lease and never run again, the
queued turns run once each, and every viewer received exactly the journal. The processes run the
units' own ExecStart lines (tests/support/deployed.py). The other tests hold the deployment
files to the README's configuration and to what the code does. docs/reliability.md has the figures.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db.models import Count

from hermesweb.channel_layer import redis_channel_layer
from intents.models import IntentState, PendingIntent
from runs.controls import do_cancel, do_respond_approval
from runs.models import Run, RunStatus
from tests import factories
from tests.support import deployed, procs
from tests.support.live import DEFAULT_REDIS_URL, session_cookie
from tests.support.runs import assert_journal_well_formed, events, refreshed, run_of, submit, wait_event
from tests.support.viewers import assert_matches_journal

REPO = deployed.REPO
# Short enough to keep the test well under a minute; the promise is "within the lease" whatever it is.
LEASE_SECONDS = 6.0
TERMINAL = [RunStatus.COMPLETED, RunStatus.CANCELLED, RunStatus.FAILED, RunStatus.INTERRUPTED]


# ---------------------------------------------------------------- the deployment files


def readme_variables() -> list[str]:
    """The variables of README.md's configuration table (`NAME` / `OTHER` in its first column)."""
    text = (REPO / "README.md").read_text()
    table = text.split("## Configuration (environment)", 1)[1].split("\n\n", 2)[1]
    names: list[str] = []
    for row in table.splitlines()[2:]:
        first = row.split("|")[1]
        names += re.findall(r"`([A-Z][A-Z0-9_]+)`", first)
    assert len(names) > 15, names
    return names


def test_the_environment_example_has_every_configuration_variable_with_a_comment() -> None:
    lines = deployed.ENV_EXAMPLE.read_text().splitlines()
    for name in readme_variables():
        at = [i for i, line in enumerate(lines) if re.match(rf"#? ?{name}=", line)]
        assert at, f"{name} (README's configuration table) is missing from {deployed.ENV_EXAMPLE.name}"
        above = at[0] - 1  # a comment may describe a group of variables (pool max and timeout)
        while above > 0 and re.match(r"#? ?[A-Z][A-Z0-9_]*=", lines[above]):
            above -= 1
        assert lines[above].startswith("# "), f"{name} has no comment above it"


def test_the_environment_example_configures_a_process(tmp_path: Path) -> None:
    """Sourced as the units' EnvironmentFile would give it (sh reads the same format), it loads."""
    (tmp_path / "data").mkdir()
    (tmp_path / "roots").mkdir()
    (tmp_path / "agents.toml").write_text('[agents.hermes]\ncommand = "/opt/hermes/bin/hermes-acp"\n')
    probe = (
        "import django, redis; django.setup(); from django.conf import settings as s; "
        "pool = redis.Redis.from_url(s.REDIS_URL).connection_pool.connection_kwargs; "
        "print(s.HERMESWEB_HTTPS, s.SESSION_COOKIE_SECURE, s.ALLOWED_HOSTS, s.DEBUG, "
        "s.DATABASES['default']['ENGINE'], pool['socket_timeout'], pool['socket_connect_timeout'], "
        "pool['password'], s.CHANNEL_LAYERS['default']['BACKEND'], sorted(s.HERMESWEB_AGENTS))"
    )
    script = (
        f"set -a; . {shlex.quote(str(deployed.ENV_EXAMPLE))}; set +a; "
        f"HERMESWEB_DATA_DIR={shlex.quote(str(tmp_path / 'data'))} "
        f"HERMESWEB_ALLOWED_ROOTS={shlex.quote(str(tmp_path / 'roots'))} "
        f"HERMESWEB_AGENTS_FILE={shlex.quote(str(tmp_path / 'agents.toml'))} "
        f"exec {shlex.quote(sys.executable)} -c {shlex.quote(probe)}"
    )
    env = {"PATH": os.environ["PATH"], "DJANGO_SETTINGS_MODULE": "hermesweb.settings"}
    done = subprocess.run(["sh", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "True",
        "True",
        "['hermes.example.com']",
        "False",
        "django.db.backends.postgresql",
        "1.0",
        "1.0",
        "CHANGE-ME",  # Redis with a password (docs/deploy.md), and every message sealed:
        "hermesweb.channel_layer.SealedPubSubLayer",
        "['claude',",  # the built-in entries (runs/agents.py), beside the file's
        "'codex',",
        "'demo',",
        "'hermes']",
    ], done.stdout


def test_the_units_run_the_commands_of_deploy_commands_sh() -> None:
    web = deployed.unit_directives(deployed.WEB_UNIT)
    runner = deployed.unit_directives(deployed.RUNNER_UNIT)
    assert shlex.split(web["ExecStart"][0]) == [f"{deployed.INSTALL_DIR}/deploy/commands.sh", "web", "%i"]
    # No --id: a runner restarted under its predecessor's id would not start (runs.models.Runner).
    assert shlex.split(runner["ExecStart"][0]) == [f"{deployed.INSTALL_DIR}/deploy/commands.sh", "runner"]
    for unit in (web, runner):
        assert unit["EnvironmentFile"] == ["/etc/hermesweb/hermesweb.env"]
        assert unit["WorkingDirectory"] == [deployed.INSTALL_DIR]
    # SIGTERM to the runner alone, so its agents live through the drain; time for the drain.
    assert runner["KillMode"] == ["mixed"] and runner["KillSignal"] == ["SIGTERM"]
    assert float(runner["TimeoutStopSec"][0]) >= 20 + 30
    assert os.access(deployed.COMMANDS, os.X_OK)
    # The command lines a test runs are the units' own, moved to this checkout.
    assert deployed.exec_start(deployed.WEB_UNIT, "8001") == [str(deployed.COMMANDS), "web", "8001"]
    assert deployed.exec_start(deployed.RUNNER_UNIT, "1") == [str(deployed.COMMANDS), "runner"]


def nginx_locations(text: str) -> dict[str, str]:
    return dict(re.findall(r"location\s+(\S+)\s*\{(.*?)\n    \}", text, re.S))


def test_the_nginx_site_balances_every_web_process_without_stickiness() -> None:
    text = deployed.NGINX_SITE.read_text()
    code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    upstream = re.search(r"upstream hermesweb_web \{(.*?)\}", code, re.S)
    assert upstream is not None
    assert len(re.findall(r"^\s*server\s", upstream.group(1), re.M)) >= 2
    for sticky in ("ip_hash", "hash ", "sticky", "least_conn"):
        assert sticky not in upstream.group(1)
    assert "listen 443 ssl" in code and "ssl_certificate " in code
    locations = nginx_locations(code)
    assert {"/ws/", "/static/", "/"} <= set(locations)
    ws = locations["/ws/"]
    assert "proxy_set_header Upgrade    $http_upgrade;" in ws
    assert "proxy_set_header Connection $hermesweb_connection;" in ws
    # A location that sets any header inherits none: each sets all of them, overwriting the
    # client's X-Forwarded-* (daphne --proxy-headers takes the first address of the list).
    for name, body in locations.items():
        if "proxy_pass" in body:
            assert "proxy_set_header Host              $http_host;" in body, name
            assert "proxy_set_header X-Forwarded-For   $remote_addr;" in body, name
            assert "proxy_set_header X-Forwarded-Proto $scheme;" in body, name
    assert "root /srv/hermesweb;" in locations["/static/"]
    web = shlex.split(deployed.unit_directives(deployed.WEB_UNIT)["ExecStart"][0])
    assert web[1] == "web" and "--proxy-headers" in deployed.COMMANDS.read_text()


# ---------------------------------------------------------------- the topology


@pytest.fixture
def stack(settings: Any, tmp_path: Path, transactional_db: None) -> Iterator[deployed.Stack]:
    settings.REDIS_URL = os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL
    prefix = f"hwtest-{uuid.uuid4().hex[:10]}"
    settings.CHANNEL_LAYERS = {
        "default": redis_channel_layer(settings.REDIS_URL, prefix, settings.SECRET_KEY)
    }
    settings.HERMESWEB_LEASE_SECONDS = LEASE_SECONDS
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    env = deployed.deployed_env(
        HERMESWEB_REDIS_PREFIX=prefix,
        HERMESWEB_DEMO_DELAY="0.05",
        HERMESWEB_SHUTDOWN_GRACE_SECONDS="2",  # teardown only: the scenario sends no SIGTERM
    )
    stack = deployed.Stack(log_dir, env)
    try:
        yield stack
    finally:
        stack.close()
        print(stack.logs())  # shown when the test failed


def started_by(run: Run) -> list[str]:
    return [e.payload.get("runner") for e in events(run) if e.type == "run.started"]


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.timeout(120)  # ~20 s here; a hang fails fast instead of holding CI for the default 300 s
def test_two_webs_two_runners_a_moving_socket_and_a_killed_runner_lose_and_repeat_nothing(
    stack: deployed.Stack,
) -> None:
    began = time.monotonic()
    # The first runner takes at most two runs, so the second one's are the second runner's.
    doomed = stack.runner("1", HERMESWEB_MAX_RUNS_PER_RUNNER="2")
    web1, web2 = stack.webs(2)
    doomed_id = deployed.runner_id(doomed)

    up_at = time.monotonic()
    project = factories.ProjectFactory(agent="demo")
    sessions = [factories.SessionFactory(project=project, title=f"s{i}") for i in range(4)]
    cookie = session_cookie(project.owner)
    # Every session watched from both web processes; one more client moves between them.
    watchers = [
        stack.viewer(f"s{i}@web{n}", session, cookie, port, wait=False)
        for i, session in enumerate(sessions)
        for n, port in ((1, web1), (2, web2))
    ]
    mover = stack.viewer("mover", sessions[2], cookie, web1, wait=False)
    for viewer in [*watchers, mover]:
        viewer.wait_frame(lambda f: f["type"] == "session", what="the session snapshot")

    queued: dict[int, Any] = {}

    def turn(session: Any, text: str) -> Run:
        """A turn, and one more queued behind it at once (its run is active from the start)."""
        run = run_of(submit(session, text))
        queued[session.pk] = submit(session, f"fast queued turn of {session.title}", mode="queue").intent
        assert queued[session.pk] is not None, "the session's run ended before its turn was queued"
        return run

    # The doomed runner's turns wait on the user (a question), so both are still executing when
    # it dies, however slow this machine is. (Not a permission: the demo agent cannot take the
    # next turn of a session killed there; tests/test_agent_killed.py has the reproduction.)
    a1 = turn(sessions[0], "ask me")
    a2 = turn(sessions[1], "ask me too")
    procs.wait_for(
        lambda: {refreshed(a1).lease_owner, refreshed(a2).lease_owner} == {doomed_id},
        60,
        what="the first runner to claim both",
    )
    survivor = stack.runner("2")
    for run in (a1, a2):
        wait_event(run, "clarify.requested", timeout=60)
    survivor_id = deployed.runner_id(survivor)
    b1 = turn(sessions[2], "hold")  # streams until cancelled below: the moving client's run
    b2 = turn(sessions[3], "please approve this")
    request = wait_event(b2, "approval.requested", timeout=60)
    assert {refreshed(b1).lease_owner, refreshed(b2).lease_owner} == {survivor_id}

    # The moving client: from web1 to web2 while b1 streams, ...
    mover.wait_seq(b1.pk, 10, timeout=60)
    mover.connect(web2)
    mover.wait(lambda v: any(r.socket == 1 and r.run_id == b1.pk for r in v.received), 30, "b1 on web2")

    # Both runners hold runs and queued turns: kill one.
    killed_at = time.monotonic()
    doomed.kill9()  # SIGKILL, by the pid this test started
    # ... and back to web1 right after, b1 still streaming.
    mover.connect(web1)
    interrupted_after: dict[int, float] = {}

    def interrupted() -> bool:
        for run in (a1, a2):
            if run.pk not in interrupted_after and refreshed(run).status == RunStatus.INTERRUPTED:
                interrupted_after[run.pk] = time.monotonic() - killed_at
        return len(interrupted_after) == 2

    procs.wait_for(interrupted, LEASE_SECONDS + 10, what="the killed runner's runs to be interrupted")
    assert do_respond_approval(b2, request.payload["approval_id"], "allow_once").status == "accepted"
    # b1 reached the mover's third socket: stop it there (the queued turn behind it runs next).
    mover.wait(lambda v: any(r.socket == 2 and r.run_id == b1.pk for r in v.received), 30, "b1 on web1")
    assert do_cancel(b1).status == "accepted"

    def settled() -> bool:
        runs = Run.objects.filter(session__project=project)
        open_intents = PendingIntent.objects.filter(session__project=project, state=IntentState.WAITING)
        finished = not runs.exclude(status__in=TERMINAL).exists()
        return runs.count() == 8 and finished and not open_intents.exists()

    procs.wait_for(settled, 60, what="every run and queued turn to finish")
    settled_at = time.monotonic()
    every_run = list(Run.objects.filter(session__project=project).order_by("pk"))
    for viewer in [*watchers, mover]:
        runs_of_session = [r.pk for r in every_run if r.session_id == viewer.session_id]
        for run_id in runs_of_session:
            viewer.wait_terminal(run_id, timeout=30)

    # Every run ended exactly once and started exactly once.
    for run in every_run:
        assert_journal_well_formed(run)
        assert len(started_by(run)) == 1, (run.pk, started_by(run))
    for run in (a1, a2):
        done = events(run)[-1].payload
        assert done["state"] == "interrupted" and doomed_id in done["reason"], done
        assert started_by(run) == [doomed_id]  # never re-run
        assert interrupted_after[run.pk] <= LEASE_SECONDS, interrupted_after
    assert refreshed(b1).status == RunStatus.CANCELLED
    others = [run for run in every_run if run.pk not in (a1.pk, a2.pk, b1.pk)]
    for run in [b1, *others]:
        assert started_by(run) == [survivor_id]
    for run in others:
        journal = [(e.type, e.payload) for e in events(run)]
        assert run.status == RunStatus.COMPLETED, (run.pk, run.status, journal)
    # Each queued turn ran once: one run per intent, after the run it queued behind.
    per_session = dict(
        Run.objects.filter(session__project=project).values_list("session").annotate(n=Count("pk"))
    )
    assert per_session == {session.pk: 2 for session in sessions}
    for session in sessions:
        intent = queued[session.pk]
        assert intent is not None
        intent.refresh_from_db()
        assert intent.state == IntentState.DISPATCHED and intent.run is not None
        assert intent.run.prompt_text == f"fast queued turn of {session.title}"
        assert intent.run.status == RunStatus.COMPLETED

    # No viewer lost or got twice any event: deduped by (run_id, seq), exactly the journal.
    checked = redelivered = 0
    for viewer in [*watchers, mover]:
        of_session = [r.pk for r in every_run if r.session_id == viewer.session_id]
        result = assert_matches_journal(viewer, of_session)
        checked += result.checked
        redelivered += result.redelivered
    # The mover's b1 arrived over all three of its sockets, resuming from its cursors.
    assert {r.socket for r in mover.snapshot() if r.run_id == b1.pk} == {0, 1, 2}
    assert [socket for socket, _ in mover.closed] == [0, 1], mover.closed  # closed by the client

    print(
        f"FIGURE scaleout: 2 webs, 2 runners, {len(every_run)} runs, {len(watchers) + 1} viewers, "
        f"{checked} events checked, lost 0, duplicated 0 per socket, redelivered across sockets "
        f"{redelivered}; SIGKILL -> interrupted {sorted(round(t, 2) for t in interrupted_after.values())} s "
        f"(lease {LEASE_SECONDS:g} s); test {time.monotonic() - began:.1f} s (processes up "
        f"{up_at - began:.1f} s, kill at {killed_at - began:.1f} s, all settled {settled_at - began:.1f} s)"
    )
