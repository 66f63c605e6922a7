"""factory-boy factories for every model.

Projects get a fresh directory inside the first allowed root (tests/conftest.py
points HERMESWEB_ALLOWED_ROOTS at the test's tmp_path), so their paths would
pass `validate_project_path` too.
"""

from __future__ import annotations

import tempfile
from typing import Any

import factory
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from hermesweb.models import ApiToken, hash_token
from intents.models import IntentKind, IntentState, PendingIntent
from projects.models import Project, Session, Workflow
from runs.models import Control, ControlKind, EventType, JournalEvent, Run, Runner, RunStatus

__all__ = [
    "ApiToken",
    "ApiTokenFactory",
    "ControlFactory",
    "JournalEventFactory",
    "PendingIntentFactory",
    "ProjectFactory",
    "RunFactory",
    "RunnerFactory",
    "SessionFactory",
    "UserFactory",
    "WorkflowFactory",
]


def project_dir() -> str:
    root = settings.HERMESWEB_ALLOWED_ROOTS[0]
    return str(tempfile.mkdtemp(prefix="project-", dir=root))


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
    password = factory.django.Password("correct horse battery staple")


class ApiTokenFactory(factory.django.DjangoModelFactory):
    """A token whose raw value is `raw` (default: hw_test_<n>); use ApiToken.issue for a real one."""

    class Meta:
        model = ApiToken
        exclude = ("raw",)

    user = factory.SubFactory(UserFactory)
    raw = factory.Sequence(lambda n: f"hw_test_token_{n:04d}")
    name = "test"
    digest = factory.LazyAttribute(lambda t: hash_token(t.raw))
    prefix = factory.LazyAttribute(lambda t: t.raw[:10])


class ProjectFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Project

    name = factory.Sequence(lambda n: f"Project {n}")
    slug = factory.Sequence(lambda n: f"project-{n}")
    path = factory.LazyFunction(project_dir)
    agent = "demo"
    owner = factory.SubFactory(UserFactory)


class WorkflowFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Workflow

    project = factory.SubFactory(ProjectFactory)
    name = factory.Sequence(lambda n: f"Workflow {n}")
    description = "Reviews a file."
    prompt_template = "Review {file} for {concern}."


class SessionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Session

    project = factory.SubFactory(ProjectFactory)
    title = factory.Sequence(lambda n: f"Session {n}")


class RunFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Run

    session = factory.SubFactory(SessionFactory)
    client_id = factory.Sequence(lambda n: f"client-{n}")
    prompt_text = "Hello"
    status = RunStatus.QUEUED


class JournalEventFactory(factory.django.DjangoModelFactory):
    """Inserts an event row directly, bypassing the journal: keep `run.last_seq` in step yourself."""

    class Meta:
        model = JournalEvent

    run = factory.SubFactory(RunFactory)
    seq = factory.Sequence(lambda n: n + 1)
    type = EventType.TOKEN_DELTA
    payload = factory.LazyFunction(lambda: {"message_id": "m1", "delta": "hi"})


class ControlFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Control

    run = factory.SubFactory(RunFactory, status=RunStatus.RUNNING)
    kind = ControlKind.CANCEL
    key = factory.Sequence(lambda n: f"control-{n}")


class RunnerFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Runner

    id = factory.Sequence(lambda n: f"runner-{n}")
    host = "localhost"
    pid = factory.Sequence(lambda n: 1000 + n)
    heartbeat_at = factory.LazyFunction(timezone.now)


class PendingIntentFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = PendingIntent

    session = factory.SubFactory(SessionFactory)
    client_id = factory.Sequence(lambda n: f"intent-{n}")
    kind = IntentKind.QUEUE
    state = IntentState.WAITING
    text = "Then run the tests."
    position = factory.Sequence(lambda n: n)


def run_with_events(events: list[tuple[str, dict[str, Any]]], **run_fields: Any) -> Run:
    """A run whose journal holds `events` appended through runs.journal (seq, redaction, terminal)."""
    from runs import journal

    run = RunFactory(**run_fields)
    journal.append_batch(run.pk, [journal.NewEvent(kind, payload) for kind, payload in events], publish=False)
    run.refresh_from_db()
    return run
