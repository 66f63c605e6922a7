"""Redis dies mid-run and comes back (issue 23): a private redis-server, killed and restarted.

While it is down, live delivery falls back to the database (the feed's safety poll) without
losing or repeating an event, a new turn submitted through the web process still runs, and
`/api/health` answers 503 naming the channel layer. When it is back, delivery returns to pub/sub:
the web process subscribes again, the runner's notifications reach Redis again, and events
arrive without the poll's delay.

On PostgreSQL the runners' doorbell is the database's NOTIFY, which Redis does not carry; on
SQLite with Redis it is the channel layer's `runners` group, so the SQLite variant slows the
runner's poll to 5 s: during the outage a new turn waits for that poll (latency, never work),
and after it the runner is subscribed again. That variant needs no REDIS_URL (the server is the
test's own), so it runs in bin/test's SQLite pass. docs/reliability.md has the figures.
"""

from __future__ import annotations

import os
import signal
import statistics
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from hermesweb.channel_layer import SealedPubSubLayer, redis_channel_layer, sealing_keys
from runs.controls import do_cancel
from runs.models import Run, RunStatus
from tests import factories
from tests.support import deployed, procs
from tests.support.hold import release
from tests.support.live import session_cookie
from tests.support.redis_server import RedisServer
from tests.support.runs import assert_journal_well_formed, refreshed, run_of, submit, wait_status
from tests.support.viewers import Received, Viewer, assert_matches_journal

pytestmark = pytest.mark.django_db(transaction=True)

# The feed's safety poll with Redis (HERMESWEB_LIVE_SAFETY_POLL_SECONDS' default), written out:
# during the outage it is the delivery, and the figures below are read against it.
SAFETY_POLL_SECONDS = 2.0


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def stack(
    settings: Any, tmp_path: Path, private_redis: RedisServer, transactional_db: None
) -> Iterator[deployed.Stack]:
    prefix = f"hwtest-{uuid.uuid4().hex[:10]}"
    settings.REDIS_URL = private_redis.url
    settings.CHANNEL_LAYERS = {"default": redis_channel_layer(private_redis.url, prefix, settings.SECRET_KEY)}
    settings.HERMESWEB_TEST_REDIS_PREFIX = prefix
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    env = deployed.deployed_env(
        HERMESWEB_REDIS_PREFIX=prefix,
        HERMESWEB_DEMO_DELAY="0.05",
        HERMESWEB_LIVE_SAFETY_POLL_SECONDS=str(SAFETY_POLL_SECONDS),
        HERMESWEB_SHUTDOWN_GRACE_SECONDS="2",  # teardown only
    )
    stack = deployed.Stack(log_dir, env)
    try:
        yield stack
    finally:
        stack.close()
        print(stack.logs())


def committed_after(viewer: Viewer, moment: float) -> list[Received]:
    return [r for r in viewer.snapshot() if r.created_at > moment]


def submitted(viewer: Viewer, client_id: str) -> dict[str, Any]:
    frame = viewer.wait_frame(
        lambda f: f["type"] == "submitted" and f["client_id"] == client_id, 30, f"the answer to {client_id}"
    )
    assert "result" in frame, frame
    return dict(frame["result"])


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# The runner's poll in the SQLite variant, where Redis is its doorbell.
SQLITE_RUNNER_POLL_SECONDS = 5.0


@pytest.mark.timeout(120)  # ~25 s here
@pytest.mark.parametrize(
    "database",
    [
        pytest.param("postgresql", marks=[pytest.mark.postgres, pytest.mark.redis]),
        pytest.param("sqlite", marks=pytest.mark.sqlite),
    ],
)
def test_redis_dies_mid_run_and_comes_back_without_losing_or_repeating_an_event(
    stack: deployed.Stack, private_redis: RedisServer, settings: Any, database: str
) -> None:
    if connection.vendor != database:
        pytest.skip(f"the {database} variant (this run's database is {connection.vendor})")
    began = time.monotonic()
    doorbell_is_redis = database == "sqlite"
    if doorbell_is_redis:
        runner = stack.runner("1", HERMESWEB_RUNNER_POLL_SECONDS=str(SQLITE_RUNNER_POLL_SECONDS))
    else:
        runner = stack.runner("1")
    web = stack.web()
    web_process = stack.procs[-1]
    deployed.runner_id(runner)
    project = factories.ProjectFactory(agent="demo")
    streaming_session, idle_session = (factories.SessionFactory(project=project) for _ in range(2))
    cookie = session_cookie(project.owner)
    watching = stack.viewer("streaming", streaming_session, cookie, web)
    other = stack.viewer("idle", idle_session, cookie, web)
    status, body = deployed.health(web, cookie)
    assert status == 200 and body["channel_layer"]["ok"] and body["channel_layer"]["redis"], body

    # Held open until every step of the outage is done: released near the end, below.
    held = run_of(submit(streaming_session, "hold"))
    watching.wait_seq(held.pk, 10, timeout=30)
    before = [r.latency for r in watching.snapshot()]

    # ---- Redis dies mid-run.
    killed = private_redis.kill()
    status, body = deployed.health(web, cookie)
    health_reported = time.time() - killed
    assert status == 503 and body["ok"] is False, body
    assert body["database"]["ok"] is True
    layer = body["channel_layer"]
    assert layer["ok"] is False and layer["redis"] is True and layer["error"], layer

    # Delivery falls back to the database: events committed after the kill still arrive.
    watching.wait(lambda v: committed_after(v, killed), 30, "an event committed during the outage")
    fallback = min(r.at for r in committed_after(watching, killed)) - killed

    # A new turn submitted during the outage, through the web process's socket, runs.
    sent = time.monotonic()
    other.send(type="submit", client_id="during-the-outage", text="fast, during the outage")
    new_turn = submitted(other, "during-the-outage")
    assert new_turn["kind"] == "run", new_turn
    during = Run.objects.get(pk=new_turn["run_id"])
    other.wait_terminal(during.pk, timeout=30)
    turn_delivered = time.monotonic() - sent
    assert refreshed(during).status == RunStatus.COMPLETED
    turn_ran = (refreshed(during).finished_at - refreshed(during).created_at).total_seconds()
    # And one queued behind the streaming run: it runs once that run ends.
    watching.send(type="submit", client_id="queued-in-outage", text="fast, queued", mode="queue")
    queued = submitted(watching, "queued-in-outage")
    assert queued["kind"] == "queue", queued
    watching.wait(lambda v: len(committed_after(v, killed)) >= 20, 30, "twenty events of the outage")
    outage = [r.latency for r in committed_after(watching, killed)]
    # The web polls the database at the embedded rate once it finds the layer down (a check every
    # 0.5 s): not at the 2-s safety poll (docs/reliability.md, gap 2).
    assert median(outage) < SAFETY_POLL_SECONDS / 4, (median(outage), outage)
    status, body = deployed.health(web, cookie)
    assert status == 503, body  # for as long as it lasts
    assert private_redis.alive() is False

    # ---- Redis comes back (same port, empty: nothing was stored in it).
    private_redis.start()
    back = time.time()
    procs.wait_for(lambda: deployed.health(web, cookie)[0] == 200, 30, what="health to be 200 again")
    health_back = time.time() - back
    journal_channel = f"{settings.HERMESWEB_TEST_REDIS_PREFIX}__group__journal"
    with private_redis.client() as client:
        # The web process subscribed again to the runners' journal notifications.
        procs.wait_for(
            lambda: client.pubsub_numsub(journal_channel)[0][1] >= 1, 30, what="the web to subscribe again"
        )
        resubscribed = time.time() - back
        if doorbell_is_redis:  # ... and the runner to its doorbell
            runners_channel = f"{settings.HERMESWEB_TEST_REDIS_PREFIX}__group__runners"
            procs.wait_for(
                lambda: client.pubsub_numsub(runners_channel)[0][1] >= 1, 30, what="the runner to listen"
            )
        # ... and the web's own publishes go out again: its probe found the layer back (health's
        # ping can answer first, while a ring is still skipped and the runner's poll takes the turn).
        procs.wait_for(
            lambda: "channel layer is back" in web_process.log(), 30, what="the web to publish again"
        )
        listener = client.pubsub()
        listener.subscribe(journal_channel)
        # A browser's next message, through the web process (whose publishes failed during the
        # outage, so it connects afresh: a process that published nothing meanwhile loses its
        # first ring on the connection Redis closed, and the runner's poll takes the turn).
        other.send(type="submit", client_id="after-the-return", text="hold, after the return")
        fresh = Run.objects.get(pk=submitted(other, "after-the-return")["run_id"])
        # The runner's notifications reach Redis again ...
        decoder = SealedPubSubLayer(
            hosts=[private_redis.url], symmetric_encryption_keys=sealing_keys(settings.SECRET_KEY)
        )
        published: list[dict[str, Any]] = []

        def a_notification_of_the_fresh_run() -> bool:
            message = listener.get_message(ignore_subscribe_messages=True, timeout=0.5)
            if message is not None:
                published.append(decoder.deserialize(message["data"]))
            return any(item["run_id"] == fresh.pk for m in published for item in m.get("runs", ()))

        procs.wait_for(a_notification_of_the_fresh_run, 30, what="the runner to publish again")
        listener.close()
    # ... and viewers get what is committed from then on without the poll's delay.
    publishing = time.time()
    other.wait(lambda v: len([r for r in committed_after(v, publishing) if r.run_id == fresh.pk]) >= 20, 30)
    after = [r.latency for r in committed_after(other, publishing) if r.run_id == fresh.pk][:20]
    assert median(after) < SAFETY_POLL_SECONDS / 4, (median(after), after)
    assert do_cancel(fresh).status == "accepted"
    claimed = {
        moment: round((refreshed(run).started_at - refreshed(run).created_at).total_seconds(), 3)
        for moment, run in (("before", held), ("during", during), ("after", fresh))
    }
    if doorbell_is_redis:  # rung, not polled (a 5 s poll)
        assert claimed["after"] < SQLITE_RUNNER_POLL_SECONDS / 2, claimed

    # The two held runs share the project's directory: the release must find only the first.
    wait_status(fresh, RunStatus.CANCELLED, timeout=40, log=runner.log)
    release(project.path)

    # ---- Every run ends once, and every viewer got exactly the journal.
    wait_status(held, RunStatus.COMPLETED, timeout=40, log=runner.log)
    runs = {viewer.name: list(Run.objects.filter(session_id=viewer.session_id)) for viewer in stack.viewers}
    procs.wait_for(
        lambda: (
            all(refreshed(r).is_terminal for rs in runs.values() for r in rs)
            and Run.objects.filter(session=streaming_session).count() == 2
        ),
        40,
        what="every run to end",
    )
    runs = {viewer.name: list(Run.objects.filter(session_id=viewer.session_id)) for viewer in stack.viewers}
    checked = 0
    for viewer in stack.viewers:
        for run in runs[viewer.name]:
            assert_journal_well_formed(run)
            viewer.wait_terminal(run.pk, timeout=30)
        checked += assert_matches_journal(viewer, [r.pk for r in runs[viewer.name]]).checked
    failed_publishes = {p.name: p.log().count("channel layer publish to") for p in stack.procs}
    statuses = sorted(refreshed(r).status for rs in runs.values() for r in rs)
    assert statuses == ["cancelled", "completed", "completed", "completed"], statuses
    print(
        f"FIGURE redis_outage ({database}): health 503 after {health_reported:.2f} s; first event "
        f"committed in the outage delivered {fallback:.2f} s after the kill; "
        f"latency p50 before {median(before):.3f} s, "
        f"during {median(outage):.2f} s (max {max(outage):.2f}, safety poll {SAFETY_POLL_SECONDS:g} s), "
        f"after {median(after):.3f} s; health 200 {health_back:.2f} s and web resubscribed "
        f"{resubscribed:.2f} s after the restart; a turn submitted in the outage: "
        f"submit to done {turn_ran:.2f} s in the database, {turn_delivered:.2f} s to its viewer; "
        f"runner claimed a new turn in (s) {claimed}; "
        f"{checked} events checked, lost 0, duplicated 0; failed publishes logged {failed_publishes}; "
        f"test {time.monotonic() - began:.1f} s"
    )


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.timeout(120)  # ~20 s here
def test_a_hung_redis_loses_no_event_but_holds_the_runners_journal_writes(
    stack: deployed.Stack, private_redis: RedisServer
) -> None:
    """Redis frozen (SIGSTOP) rather than dead: connections open, no answers.

    Promised and asserted: nothing lost or repeated, health says so, and the runner's journal
    writes go on: a publish waits at most runs.notify.PUBLISH_TIMEOUT_SECONDS, then publishes
    are skipped until a background probe finds Redis back.
    """
    options = os.environ.get("HERMESWEB_TEST_REDIS_URL_OPTIONS", "")
    if options:
        stack.env["REDIS_URL"] = f"{private_redis.url}?{options}"
    runner = stack.runner("1")
    web = stack.web()
    deployed.runner_id(runner)
    project = factories.ProjectFactory(agent="demo")
    session = factories.SessionFactory(project=project)
    cookie = session_cookie(project.owner)
    viewer = stack.viewer("hung", session, cookie, web)
    held = run_of(submit(session, "hold"))  # streaming until released, after the windows
    viewer.wait_seq(held.pk, 10, timeout=30)

    def writes_per_second(seconds: float) -> float:
        first = refreshed(held).last_seq
        time.sleep(seconds)  # a measurement window, not a synchronisation
        return (refreshed(held).last_seq - first) / seconds

    normal = writes_per_second(2)
    assert private_redis.proc is not None
    private_redis.proc.send_signal(signal.SIGSTOP)
    try:
        asked = time.monotonic()
        status, body = deployed.health(web, cookie)
        health_took = time.monotonic() - asked
        assert status == 503 and body["channel_layer"]["ok"] is False, body
        hung = writes_per_second(6)
    finally:
        private_redis.proc.send_signal(signal.SIGCONT)
    after = writes_per_second(2)
    release(project.path)
    wait_status(held, RunStatus.COMPLETED, timeout=60, log=runner.log)
    viewer.wait_terminal(held.pk, timeout=30)
    assert_journal_well_formed(held)
    checked = assert_matches_journal(viewer, [held.pk]).checked
    # One publish timed out (about a second of the window); the rest of the window streamed.
    assert hung >= normal / 3, (normal, hung)
    print(
        f"FIGURE redis_hung (REDIS_URL options {options or 'none'}): journal writes/s of a streaming "
        f"run before {normal:.1f}, while Redis is stopped {hung:.1f}, after {after:.1f}; health 503 in "
        f"{health_took:.2f} s; {checked} events checked, lost 0, duplicated 0"
    )
