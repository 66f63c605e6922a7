"""Placement across hosts (issue 43): two runners with disjoint roots and labels, as two hosts
without shared project storage would run them (docs/deploy.md). PostgreSQL + Redis, real runner
processes and the demo agent."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hermesweb.channel_layer import redis_channel_layer
from projects.models import Project
from runs import capacity
from runs.live.user_states import read_states
from runs.models import Run, Runner, RunStatus
from tests import factories
from tests.support import deployed, procs
from tests.support.live import DEFAULT_REDIS_URL
from tests.support.runs import assert_journal_well_formed, events, refreshed, run_of, submit

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(240)]


@pytest.fixture
def stack(settings: Any, tmp_path: Path, transactional_db: None) -> Iterator[deployed.Stack]:
    settings.REDIS_URL = os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL
    prefix = f"hwtest-{uuid.uuid4().hex[:10]}"
    settings.CHANNEL_LAYERS = {
        "default": redis_channel_layer(settings.REDIS_URL, prefix, settings.SECRET_KEY)
    }
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    env = deployed.deployed_env(
        HERMESWEB_REDIS_PREFIX=prefix, HERMESWEB_DEMO_DELAY="0.02", HERMESWEB_SHUTDOWN_GRACE_SECONDS="5"
    )
    stack = deployed.Stack(log_dir, env)
    try:
        yield stack
    finally:
        stack.close()
        print(stack.logs())  # shown when the test failed


def started_by(run: Run) -> list[str]:
    return [e.payload.get("runner") for e in events(run) if e.type == "run.started"]


def host_project(owner: Any, root: Path, host: str) -> Project:
    """A project in `root` (one host's storage) that only that host's runner may serve."""
    path = tempfile.mkdtemp(prefix="project-", dir=root)
    return factories.ProjectFactory(owner=owner, path=path, agent="demo", required_labels=[f"host={host}"])


def turns(project: Project, count: int, text: str) -> list[Run]:
    """`count` turns, each in a session of its own (a session runs its turns one at a time)."""
    return [run_of(submit(factories.SessionFactory(project=project), f"{text} {i}")) for i in range(count)]


def completed(runs: list[Run]) -> bool:
    return all(refreshed(run).status == RunStatus.COMPLETED for run in runs)


def test_each_project_runs_only_on_its_runner_and_waits_visibly_while_that_runner_is_down(
    stack: deployed.Stack, settings: Any, tmp_path: Path
) -> None:
    roots = {host: tmp_path / f"storage-{host}" for host in ("build-1", "build-2")}
    for root in roots.values():
        root.mkdir()
    settings.HERMESWEB_ALLOWED_ROOTS = [root.resolve() for root in roots.values()]
    settings.HERMESWEB_MAX_ACTIVE_RUNS_PER_USER = 50  # placement alone decides here

    def start(host: str) -> tuple[procs.Proc, str]:
        proc = stack.runner(
            host, HERMESWEB_ALLOWED_ROOTS=str(roots[host].resolve()), HERMESWEB_RUNNER_LABELS=f"host={host}"
        )
        return proc, deployed.runner_id(proc)

    (one, one_id), (two, two_id) = start("build-1"), start("build-2")
    assert Runner.objects.get(pk=one_id).labels == ["host=build-1"]
    assert Runner.objects.get(pk=two_id).roots == [str(roots["build-2"].resolve())]
    owner = factories.UserFactory()
    first, second = (
        host_project(owner, roots["build-1"], "build-1"),
        host_project(owner, roots["build-2"], "build-2"),
    )

    # Both up: each project's turns run, and only on its own runner.
    on_one, on_two = turns(first, 3, "hello"), turns(second, 3, "hello")
    procs.wait_for(lambda: completed(on_one + on_two), 90, what="both projects' turns to complete")
    assert [started_by(run) for run in on_one] == [[one_id]] * 3
    assert [started_by(run) for run in on_two] == [[two_id]] * 3

    # The second host's runner stops: its project's turns wait, and say why, while the first's go on.
    two.stop(timeout=30)
    assert not Runner.objects.alive().filter(pk=two_id).exists()
    waiting = turns(second, 3, "queued while down")
    meanwhile = turns(first, 2, "meanwhile")
    procs.wait_for(lambda: completed(meanwhile), 60, what="the first project's turns to complete")
    assert [refreshed(run).status for run in waiting] == [RunStatus.QUEUED] * 3
    why = capacity.waiting_of(run.pk for run in waiting)
    assert {w.reason for w in why.values()} == {capacity.RUNNER}
    assert why[waiting[0].pk].labels == ["host=build-2"]
    sidebar = read_states(owner.pk)[waiting[0].session_id]
    assert sidebar.waiting is not None and sidebar.waiting["reason"] == "waiting_for_runner"
    from runs.placement import unserved_projects

    assert [u.project_id for u in unserved_projects()] == [second.pk]

    # It comes back: it drains them in the order they were sent, each once; nothing was lost.
    two_again, two_again_id = start("build-2")
    procs.wait_for(lambda: completed(waiting), 90, what="the waiting turns to drain")
    drained = sorted((refreshed(run) for run in waiting), key=lambda run: run.started_at)
    assert [run.pk for run in drained] == [run.pk for run in waiting]
    assert [started_by(run) for run in waiting] == [[two_again_id]] * 3
    assert unserved_projects() == []
    every = Run.objects.filter(session__project__in=[first, second])
    assert every.count() == 11 and not every.exclude(status=RunStatus.COMPLETED).exists()
    for run in every:
        assert_journal_well_formed(run)
        assert len(started_by(run)) == 1
    assert not Run.objects.filter(session__project=first, lease_owner__in=[two_id, two_again_id]).exists()
    assert not Run.objects.filter(session__project=second, lease_owner=one_id).exists()
    assert one.alive() and two_again.alive()
