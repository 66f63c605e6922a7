"""A runner started again under a fixed id (`runner --id`, one per systemd instance)."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from django.utils import timezone

from runs.models import Run, Runner, RunStatus
from runs.runner.leases import RunnerIdInUse, register_runner
from tests.factories import RunFactory

pytestmark = pytest.mark.django_db


def test_an_id_whose_runner_stopped_is_taken_again() -> None:
    Runner.objects.create(id="web-1", host="elsewhere", pid=1, stopped_at=timezone.now())

    runner = register_runner("web-1")

    assert (runner.pid, runner.stopped_at) == (os.getpid(), None)
    assert Runner.objects.filter(pk="web-1").count() == 1


def test_an_id_whose_runner_went_silent_is_taken_again_and_its_runs_are_interrupted() -> None:
    long_ago = timezone.now() - timedelta(hours=1)
    Runner.objects.create(id="r-1", host="elsewhere", pid=4242, heartbeat_at=long_ago)
    left = RunFactory(status=RunStatus.RUNNING, lease_owner="r-1", lease_expires_at=long_ago)

    register_runner("r-1")

    left.refresh_from_db()
    assert left.status == RunStatus.INTERRUPTED
    assert "pid 4242" in left.error


def test_an_id_whose_runner_still_heartbeats_is_refused() -> None:
    Runner.objects.create(id="r-2", host="elsewhere", pid=7, heartbeat_at=timezone.now())
    busy = RunFactory(status=RunStatus.RUNNING, lease_owner="r-2")

    with pytest.raises(RunnerIdInUse):
        register_runner("r-2")

    assert Run.objects.get(pk=busy.pk).status == RunStatus.RUNNING
