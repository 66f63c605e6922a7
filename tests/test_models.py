"""Models and their database constraints: facts the database keeps, whatever the code does."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from hermesweb.models import ApiToken, hash_token
from intents.models import IntentState, PendingIntent
from projects.models import Project, Session, Workflow
from runs.models import Control, JournalEvent, Run, Runner, RunStatus
from tests.factories import (
    ApiTokenFactory,
    ControlFactory,
    JournalEventFactory,
    PendingIntentFactory,
    ProjectFactory,
    RunFactory,
    RunnerFactory,
    SessionFactory,
    UserFactory,
    WorkflowFactory,
)

pytestmark = pytest.mark.django_db


def violates(create: Any) -> bool:
    try:
        with transaction.atomic():
            create()
    except IntegrityError:
        return True
    return False


def test_every_factory_builds_a_saved_object() -> None:
    objects = [
        UserFactory(), ApiTokenFactory(), ProjectFactory(), WorkflowFactory(), SessionFactory(), RunFactory(),
        JournalEventFactory(), ControlFactory(), RunnerFactory(), PendingIntentFactory(),
    ]  # fmt: skip
    assert all(obj.pk is not None for obj in objects)


# ---------------------------------------------------------------- projects


def test_a_slug_is_unique_per_owner_only() -> None:
    owner = UserFactory()
    ProjectFactory(owner=owner, slug="app")

    assert violates(lambda: ProjectFactory(owner=owner, slug="app"))
    assert not violates(lambda: ProjectFactory(slug="app"))


def test_visible_to_limits_users_to_their_own_objects_staff_too() -> None:
    ada, bob, staff = UserFactory(), UserFactory(), UserFactory(is_staff=True)
    run = RunFactory(session=SessionFactory(project=ProjectFactory(owner=ada)))
    intent = PendingIntentFactory(session=run.session)
    workflow = WorkflowFactory(project=run.session.project)

    for model, obj in [
        (Project, run.session.project), (Workflow, workflow), (Session, run.session), (Run, run),
        (PendingIntent, intent),
    ]:  # fmt: skip
        assert list(model.objects.visible_to(ada)) == [obj]
        assert list(model.objects.visible_to(bob)) == []
        assert list(model.objects.visible_to(staff)) == []


def test_workflow_variables_are_listed_in_order_of_first_use() -> None:
    workflow = Workflow(prompt_template="Fix {bug} in {file}, then test {file}; {{not_a_var}}")
    assert workflow.variables() == ["bug", "file"]


def test_workflow_render_substitutes_and_names_missing_variables() -> None:
    workflow = Workflow(prompt_template="Fix {bug} in {file} ({{literal}})")

    assert workflow.render({"bug": "#12", "file": "app.py"}) == "Fix #12 in app.py ({literal})"
    with pytest.raises(KeyError, match="bug, file"):
        workflow.render({})


def test_workflow_render_refuses_fields_that_are_not_plain_names() -> None:
    with pytest.raises(ValueError):
        Workflow(prompt_template="{user.password}").render({"user": "x"})


def test_session_active_run_is_the_queued_or_executing_one() -> None:
    session = SessionFactory()
    RunFactory(session=session, status=RunStatus.COMPLETED)
    assert session.active_run() is None

    active = RunFactory(session=session, status=RunStatus.AWAITING_CLARIFY)
    assert session.active_run() == active


# ---------------------------------------------------------------- runs


def test_a_client_id_is_unique_per_session() -> None:
    session = SessionFactory()
    RunFactory(session=session, client_id="c1", status=RunStatus.COMPLETED)

    assert violates(lambda: RunFactory(session=session, client_id="c1", status=RunStatus.COMPLETED))
    assert not violates(lambda: RunFactory(client_id="c1"))


@pytest.mark.parametrize("second", [RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.CANCELLING])
def test_a_session_never_has_two_active_runs(second: str) -> None:
    session = SessionFactory()
    RunFactory(session=session, status=RunStatus.RUNNING)

    assert violates(lambda: RunFactory(session=session, status=second))
    assert not violates(lambda: RunFactory(session=session, status=RunStatus.FAILED))


def test_run_status_helpers() -> None:
    run = RunFactory(status=RunStatus.RUNNING)
    assert run.is_active and not run.is_terminal
    assert run.last_event_id is None

    run.last_seq = 7
    run.status = RunStatus.INTERRUPTED
    assert run.last_event_id == f"{run.pk}:7"
    assert run.is_terminal and not run.is_active


def test_an_executing_run_with_a_lapsed_lease_is_stale() -> None:
    now = timezone.now()
    lapsed = RunFactory(status=RunStatus.RUNNING, lease_expires_at=now - timedelta(seconds=1))
    held = RunFactory(status=RunStatus.RUNNING, lease_expires_at=now + timedelta(seconds=10))
    never = RunFactory(status=RunStatus.AWAITING_APPROVAL, lease_expires_at=None)
    queued = RunFactory(status=RunStatus.QUEUED)

    assert set(Run.objects.stale(now)) == {lapsed, never}
    assert lapsed.lease_is_stale(now) and never.lease_is_stale(now)
    assert not held.lease_is_stale(now) and not queued.lease_is_stale(now)


def test_seq_is_unique_per_run() -> None:
    run = RunFactory()
    JournalEventFactory(run=run, seq=1)

    assert violates(lambda: JournalEventFactory(run=run, seq=1))
    assert not violates(lambda: JournalEventFactory(seq=1))


def test_a_run_has_at_most_one_terminal_event() -> None:
    run = RunFactory()
    JournalEventFactory(run=run, seq=1, type="done", terminal=True, payload={"state": "completed"})

    assert violates(lambda: JournalEventFactory(run=run, seq=2, type="done", terminal=True))


def test_an_event_id_is_run_and_seq() -> None:
    event = JournalEventFactory(seq=3)
    assert event.event_id == f"{event.run_id}:3"
    assert str(event) == f"{event.run_id}:3 token.delta"


def test_a_control_key_is_unique_per_run() -> None:
    run = RunFactory(status=RunStatus.RUNNING)
    ControlFactory(run=run, key="cancel")

    assert violates(lambda: ControlFactory(run=run, key="cancel"))
    assert Control.objects.filter(run=run).pending().count() == 1


def test_runners_are_alive_while_their_heartbeat_is_fresh(settings: Any) -> None:
    settings.HERMESWEB_LEASE_SECONDS = 15
    now = timezone.now()
    fresh = RunnerFactory(heartbeat_at=now - timedelta(seconds=5))
    RunnerFactory(heartbeat_at=now - timedelta(seconds=60))
    RunnerFactory(heartbeat_at=now, stopped_at=now)

    assert list(Runner.objects.alive(now)) == [fresh]


def test_deleting_a_session_deletes_its_runs_events_and_intents() -> None:
    run = RunFactory()
    JournalEventFactory(run=run, seq=1)
    PendingIntentFactory(session=run.session)

    run.session.delete()

    assert (
        not Run.objects.exists() and not JournalEvent.objects.exists() and not PendingIntent.objects.exists()
    )


# ---------------------------------------------------------------- intents


def test_an_intent_client_id_is_unique_per_session() -> None:
    session = SessionFactory()
    PendingIntentFactory(session=session, client_id="c1")
    assert violates(lambda: PendingIntentFactory(session=session, client_id="c1"))


def test_open_intents_are_waiting_or_stopping() -> None:
    session = SessionFactory()
    waiting = PendingIntentFactory(session=session, state=IntentState.WAITING)
    stopping = PendingIntentFactory(session=session, state=IntentState.STOPPING)
    for state in (IntentState.DISPATCHED, IntentState.DELIVERED, IntentState.FAILED, IntentState.DELETED):
        PendingIntentFactory(session=session, state=state)

    assert set(PendingIntent.objects.open()) == {waiting, stopping}
    assert list(PendingIntent.objects.waiting()) == [waiting]


# ---------------------------------------------------------------- tokens


def test_a_token_is_stored_hashed_and_shown_once() -> None:
    token, raw = ApiToken.issue(UserFactory(), name="laptop")

    assert raw.startswith("hw_")
    assert token.digest == hash_token(raw)
    assert raw not in (token.digest, token.prefix)
    assert raw.startswith(token.prefix)
    assert ApiToken.user_for(raw) == token.user


def test_revoked_tokens_and_inactive_users_do_not_authenticate() -> None:
    revoked, raw_revoked = ApiToken.issue(UserFactory())
    ApiToken.objects.filter(pk=revoked.pk).update(revoked_at=timezone.now())
    _, raw_inactive = ApiToken.issue(UserFactory(is_active=False))

    assert ApiToken.user_for(raw_revoked) is None
    assert ApiToken.user_for(raw_inactive) is None
    assert ApiToken.user_for("hw_unknown") is None
