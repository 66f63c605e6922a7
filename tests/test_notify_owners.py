"""A session's owner is cached per process for its doorbell; a project that changes hands in the
admin drops that cache in every process, so the new owner's sidebar is rung at once."""

from __future__ import annotations

import asyncio
import os
import queue
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from channels.layers import get_channel_layer
from django.db import transaction
from django.test import Client

from hermesweb.channel_layer import redis_channel_layer
from projects.models import Project, Session
from runs import notify
from runs.models import Run, RunStatus
from tests import factories
from tests.support.live import DEFAULT_REDIS_URL
from tests.support.procs import Proc, start_runner, wait_for
from tests.support.runs import wait_status


def change_owner_in_the_admin(project: Project, owner: Any) -> None:
    """What an operator does: the project's change form, saved with another owner."""
    console = Client()
    console.force_login(factories.UserFactory(is_staff=True, is_superuser=True))
    form = {
        "name": project.name,
        "slug": project.slug,
        "path": project.path,
        "agent": project.agent,
        "running_default": project.running_default,
        "status": project.status,
        "owner": owner.pk,
        "workflows-TOTAL_FORMS": "0",
        "workflows-INITIAL_FORMS": "0",
        "workflows-MIN_NUM_FORMS": "0",
        "workflows-MAX_NUM_FORMS": "1000",
    }
    response = console.post(f"/admin/projects/project/{project.pk}/change/", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    project.refresh_from_db()
    assert project.owner_id == owner.pk


@pytest.mark.django_db(transaction=True)
def test_a_known_owner_is_rung_without_a_query(django_assert_num_queries: Any) -> None:
    session = factories.SessionFactory()
    assert notify.session_owners({session.pk}) == {session.project.owner_id}
    wait_for(lambda: notify.owner_cache.hearing, what="this process to hear owner changes")
    assert notify.session_owners({session.pk}) == {session.project.owner_id}
    with django_assert_num_queries(0):
        assert notify.session_owners({session.pk}) == {session.project.owner_id}
    # The fast path answers what the rule (the database) answers.
    assert notify.cached_owners({session.pk}) == {Session.objects.get(pk=session.pk).project.owner_id}


@pytest.mark.django_db(transaction=True)
def test_a_project_given_to_another_owner_in_the_admin_rings_the_new_owner_in_this_process() -> None:
    session = factories.SessionFactory()
    ada, bob = session.project.owner, factories.UserFactory()
    assert notify.session_owners({session.pk}) == {ada.pk}
    change_owner_in_the_admin(session.project, bob)
    assert notify.cached_owners({session.pk}) is None
    assert notify.session_owners({session.pk}) == {bob.pk}


@pytest.mark.django_db(transaction=True)
def test_saving_a_project_that_keeps_its_owner_keeps_the_cache(django_assert_num_queries: Any) -> None:
    session = factories.SessionFactory()
    owner = session.project.owner_id
    assert notify.session_owners({session.pk}) == {owner}
    project = Project.objects.get(pk=session.project_id)
    project.name = "Renamed"
    project.save()
    with django_assert_num_queries(0):
        assert notify.session_owners({session.pk}) == {owner}


@pytest.mark.django_db(transaction=True)
def test_an_owner_change_rolled_back_drops_nothing() -> None:
    session = factories.SessionFactory()
    ada = session.project.owner
    assert notify.session_owners({session.pk}) == {ada.pk}
    generation = notify.owner_cache.generation
    with pytest.raises(RuntimeError), transaction.atomic():
        project = Project.objects.get(pk=session.project_id)
        project.owner = factories.UserFactory()
        project.save()
        raise RuntimeError("roll back")
    assert notify.owner_cache.generation == generation
    assert notify.cached_owners({session.pk}) == {ada.pk}


class Doorbells:
    """The users' sessions doorbells as a web process hears them, in the order they were rung."""

    def __init__(self, *user_ids: Any) -> None:
        self.rung: queue.Queue[Any] = queue.Queue()
        self.ready = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._hear(user_ids),))
        self.thread.daemon = True
        self.thread.start()
        assert self.ready.wait(10), "not subscribed to the doorbells"

    async def _hear(self, user_ids: tuple[Any, ...]) -> None:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        for user_id in user_ids:
            await layer.group_add(notify.user_sessions_group(user_id), channel)
        self.ready.set()
        self.task = asyncio.current_task()
        try:
            while True:
                self.rung.put((await layer.receive(channel))["user_id"])
        except asyncio.CancelledError:
            pass

    def until(self, user_id: Any, timeout: float = 20.0) -> list[Any]:
        """Every ring up to and including `user_id`'s first."""
        heard: list[Any] = []
        while user_id not in heard:
            heard.append(self.rung.get(timeout=timeout))
        return heard

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.task.cancel)
        self.thread.join(10)


@pytest.fixture
def doorbells() -> Iterator[list[Doorbells]]:
    opened: list[Doorbells] = []
    yield opened
    for bells in opened:
        bells.close()


def queue_run(session: Session, text: str) -> Run:
    """A turn queued for the runner, rung by nothing but the runner (the web's own ring is fresh)."""
    with transaction.atomic():
        run = Run.objects.create(session=session, client_id=uuid.uuid4().hex, prompt_text=text)
        notify.wake_runners("run.queued", run.pk)
    return run


@pytest.fixture
def redis_layer(settings: Any) -> str:
    """This process's channel layer on a prefix of the test's own; the runner is given the same."""
    settings.REDIS_URL = os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL
    prefix = f"hwtest-{uuid.uuid4().hex[:10]}"
    settings.CHANNEL_LAYERS = {
        "default": redis_channel_layer(settings.REDIS_URL, prefix, settings.SECRET_KEY)
    }
    return prefix


def settled(bells: Doorbells, barrier: Session, barriers: set[Any]) -> list[Any]:
    """The rings before a later turn's, on a session of a user of its own: every earlier ring is
    in. Earlier barriers' late rings are left out."""
    run = queue_run(barrier, "fast barrier")
    wait_status(run, RunStatus.COMPLETED)
    return [user for user in bells.until(barrier.project.owner_id) if user not in barriers]


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_after_a_project_changes_owner_the_runner_rings_the_new_owner_without_a_restart(
    redis_layer: str, runners: list[Proc], logs: Path, doorbells: list[Doorbells], settings: Any
) -> None:
    session = factories.SessionFactory(project__agent="demo")
    first_barrier, second_barrier, third_barrier = (
        factories.SessionFactory(project__agent="demo") for _ in "123"
    )
    barriers = {b.project.owner_id for b in (first_barrier, second_barrier, third_barrier)}
    ada, bob = session.project.owner, factories.UserFactory()
    runner = start_runner(
        logs,
        "owners",
        HERMESWEB_DEMO_DELAY="0.005",
        REDIS_URL=settings.REDIS_URL,
        HERMESWEB_REDIS_PREFIX=redis_layer,
    )
    runners.append(runner)
    bells = Doorbells(ada.pk, bob.pk, *barriers)
    doorbells.append(bells)

    # The runner learns the owner with the first turn, rings her, and listens for owner changes.
    wait_status(queue_run(session, "fast one"), RunStatus.COMPLETED, log=runner.log)
    assert set(settled(bells, first_barrier, barriers)) == {ada.pk}
    with redis.Redis.from_url(settings.REDIS_URL) as client:
        owners_group = f"{redis_layer}__group__{notify.OWNERS_GROUP}"
        wait_for(lambda: client.pubsub_numsub(owners_group)[0][1] >= 1, what="the runner to hear owners")

    change_owner_in_the_admin(session.project, bob)

    # The next turn rings the new owner: the runner's cache was dropped. The drop reaches the
    # runner asynchronously, so that turn's first ring may still go to the old owner ...
    wait_status(queue_run(session, "fast two"), RunStatus.COMPLETED, log=runner.log)
    heard = settled(bells, second_barrier, barriers)
    assert bob.pk in heard, (heard, runner.log())
    # ... but once the new owner was rung the drop had arrived: from then on, only the new owner.
    wait_status(queue_run(session, "fast three"), RunStatus.COMPLETED, log=runner.log)
    heard = settled(bells, third_barrier, barriers)
    assert heard and set(heard) == {bob.pk}, (heard, runner.log())


@pytest.mark.django_db(transaction=True)
def test_a_session_moved_to_another_users_project_rings_that_user() -> None:
    session = factories.SessionFactory()
    elsewhere = factories.ProjectFactory()
    assert notify.session_owners({session.pk}) == {session.project.owner_id}
    session.project = elsewhere
    session.save()
    assert notify.cached_owners({session.pk}) is None
    assert notify.session_owners({session.pk}) == {elsewhere.owner_id}
