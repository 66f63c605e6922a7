"""The one-statement new turn (PostgreSQL) decides as the full path does, case by case.

`runs.services.new_turn_in_one_statement` states the submit rule a second time, in SQL,
because it pays on every first token (bench/README.md). The full path, under the
session's lock, is the rule's source: for each case below the fast statement must write a
turn exactly when the full path would start one, and otherwise write nothing, so the
caller falls back to the full path, which answers every other case.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.sessions.models import Session as DjangoSession
from django.db import connection

from hermesweb.auth import StillSignedIn
from projects.models import ProjectStatus, Session, SessionStatus
from runs import services
from runs.models import Run, RunSource, RunStatus
from tests.factories import RunFactory, SessionFactory
from tests.support.live import session_cookie

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


class Case:
    """A session state, and whether the full path would answer it with a new turn."""

    def __init__(self, name: str, arrange: Callable[[Any, Any, Any], dict[str, Any]], new_turn: bool) -> None:
        self.name, self.arrange, self.new_turn = name, arrange, new_turn

    def __repr__(self) -> str:
        return self.name


def idle(user: Any, other: Any, staff: Any) -> dict[str, Any]:
    return {"session": SessionFactory(project__owner=user), "viewer": user}


def someone_elses(user: Any, other: Any, staff: Any) -> dict[str, Any]:
    return {"session": SessionFactory(project__owner=other), "viewer": user}


def staff_on_someone_elses(user: Any, other: Any, staff: Any) -> dict[str, Any]:
    return {"session": SessionFactory(project__owner=other), "viewer": staff}


def archived(user: Any, other: Any, staff: Any) -> dict[str, Any]:
    return {"session": SessionFactory(project__owner=user, status=SessionStatus.ARCHIVED), "viewer": user}


def project_archived(user: Any, other: Any, staff: Any) -> dict[str, Any]:
    session = SessionFactory(project__owner=user, project__status=ProjectStatus.ARCHIVED)
    return {"session": session, "viewer": user}


def client_id_of_an_ended_run(user: Any, other: Any, staff: Any) -> dict[str, Any]:
    session = SessionFactory(project__owner=user)
    RunFactory(session=session, client_id="c1", status=RunStatus.COMPLETED)
    return {"session": session, "viewer": user}


def client_id_of_an_intent(user: Any, other: Any, staff: Any) -> dict[str, Any]:
    session = SessionFactory(project__owner=user)
    active = RunFactory(session=session, status=RunStatus.RUNNING)
    services.do_submit_message(session, client_id="c1", text="queued", mode="queue")
    Run.objects.filter(pk=active.pk).update(status=RunStatus.COMPLETED)
    return {"session": session, "viewer": user}


def another_run_active(user: Any, other: Any, staff: Any) -> dict[str, Any]:
    session = SessionFactory(project__owner=user)
    RunFactory(session=session, status=RunStatus.AWAITING_APPROVAL)
    return {"session": session, "viewer": user}


def an_ended_run_before(user: Any, other: Any, staff: Any) -> dict[str, Any]:
    session = SessionFactory(project__owner=user)
    RunFactory(session=session, client_id="c0", status=RunStatus.FAILED)
    return {"session": session, "viewer": user}


def signed_in(user: Any, other: Any, staff: Any) -> dict[str, Any]:
    key = session_cookie(user)
    guard = StillSignedIn(key, user.pk, user.password, user.is_staff)
    return {"session": SessionFactory(project__owner=user), "viewer": user, "guard": guard}


def signed_out(user: Any, other: Any, staff: Any) -> dict[str, Any]:
    arranged = signed_in(user, other, staff)
    DjangoSession.objects.filter(session_key=arranged["guard"].session_key).delete()
    return arranged


CASES = [
    Case("idle", idle, True),
    Case("after an ended run", an_ended_run_before, True),
    Case("signed in (socket guard)", signed_in, True),
    Case("another user's session", someone_elses, False),
    Case("staff on another user's session", staff_on_someone_elses, False),
    Case("archived", archived, False),
    Case("project archived", project_archived, False),
    Case("client id of an ended run", client_id_of_an_ended_run, False),
    Case("client id of an intent", client_id_of_an_intent, False),
    Case("another run active", another_run_active, False),
    Case("signed out (socket guard)", signed_out, False),
]


def full_path_starts_a_turn(session: Session, viewer: Any, guard: Any) -> bool:
    """What the full path answers, asked of it inside a transaction that is rolled back."""
    from django.db import transaction

    class RolledBack(Exception):
        pass

    answer: list[bool] = []
    try:
        with transaction.atomic():
            # Inside a transaction the fast path does not apply: this is the full path alone.
            try:
                result = services.do_submit_message_as(
                    viewer, session.pk, client_id="c1", text="Run the tests", guard=guard
                )
                answer.append(result.kind == "run" and not result.duplicate)
            except (Session.DoesNotExist, services.SubmitRefused, services.GuardFailed):
                answer.append(False)
            raise RolledBack
    except RolledBack:
        pass
    return answer[0]


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_the_one_statement_turn_decides_as_the_full_path(
    case: Case, user: Any, other_user: Any, staff_user: Any
) -> None:
    arranged = case.arrange(user, other_user, staff_user)
    session, viewer, guard = arranged["session"], arranged["viewer"], arranged.get("guard")
    runs_before = set(Run.objects.values_list("pk", flat=True))

    assert full_path_starts_a_turn(session, viewer, guard) is case.new_turn
    assert set(Run.objects.values_list("pk", flat=True)) == runs_before

    assert not connection.in_atomic_block
    run = services.new_turn_in_one_statement(
        session.pk, viewer, "c1", "Run the tests", [], RunSource.COMPOSER, None, guard
    )

    assert (run is not None) is case.new_turn
    created = set(Run.objects.values_list("pk", flat=True)) - runs_before
    if case.new_turn:
        assert run is not None and created == {run.pk}
        stored = Run.objects.get(pk=run.pk)
        assert (stored.session_id, stored.client_id, stored.prompt_text) == (
            session.pk,
            "c1",
            "Run the tests",
        )
        assert (stored.status, stored.source) == (RunStatus.QUEUED, RunSource.COMPOSER)
    else:
        assert created == set()
