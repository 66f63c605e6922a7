"""Submitting a message as a statement of its own (no caller transaction): the API's case.

On PostgreSQL a new turn of an idle session is one statement that commits alone
(runs.services.new_turn_in_one_statement); every other case takes the full path under the
session's lock. These tests run with real commits, so both paths and their races are
exercised as the API meets them.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.contrib.sessions.models import Session as DjangoSession
from django.db import connection
from django.test.utils import CaptureQueriesContext

from hermesweb.auth import StillSignedIn
from intents.models import PendingIntent
from projects.models import Session, SessionStatus
from runs import services
from runs.models import Run, RunStatus
from tests.conftest import token_client
from tests.factories import RunFactory, SessionFactory
from tests.support.live import session_cookie

pytestmark = pytest.mark.django_db(transaction=True)


def submit(user: Any, session: Any, client_id: str, text: str = "Run the tests", **kw: Any) -> Any:
    return services.do_submit_message_as(user, session.pk, client_id=client_id, text=text, **kw)


@pytest.mark.postgres
def test_a_new_turn_is_one_statement_on_postgres(user: Any) -> None:
    session = SessionFactory(project__owner=user)
    with CaptureQueriesContext(connection) as queries:
        # Without attachments: a message with them reads its uploads first (runs.attachments).
        result = submit(user, session, "c1")

    assert len(queries) == 1
    run = Run.objects.get(pk=result.run_id)
    assert (result.kind, result.status, result.duplicate) == ("run", "queued", False)
    assert (run.client_id, run.prompt_text, run.status) == ("c1", "Run the tests", RunStatus.QUEUED)
    assert run.attachments == []
    # The instance handed back is the row as stored.
    assert (result.run.created_at, result.run.source) == (run.created_at, run.source)
    session.refresh_from_db()
    assert session.updated_at == run.created_at


@pytest.mark.postgres
def test_a_new_turn_costs_the_api_two_queries_on_postgres(user: Any) -> None:
    session = SessionFactory(project__owner=user)
    client = token_client(user)
    client.get("/api/projects")  # the token's first use also records it
    with CaptureQueriesContext(connection) as queries:
        response = client.post(
            f"/api/sessions/{session.pk}/messages",
            {"client_id": "c1", "text": "hi"},
            content_type="application/json",
        )
    assert response.status_code == 202
    # The token, and the turn.
    assert len(queries) == 2


def test_a_guard_rides_in_the_write_and_once_it_fails_nothing_is_written(user: Any) -> None:
    # The socket's sign-in (hermesweb.auth.StillSignedIn) is checked by the statement that
    # writes the turn; signed out, the submit writes nothing.
    session = SessionFactory(project__owner=user)
    key = session_cookie(user)
    guard = StillSignedIn(key, user.pk, user.password, user.is_staff)
    with CaptureQueriesContext(connection) as queries:
        first = submit(user, session, "c1", guard=guard)
    assert first.kind == "run"
    if connection.vendor == "postgresql":
        assert len(queries) == 1

    DjangoSession.objects.filter(session_key=key).delete()
    Run.objects.filter(pk=first.run_id).update(status=RunStatus.COMPLETED)
    with pytest.raises(services.GuardFailed):
        submit(user, session, "c2", guard=guard)
    assert list(Run.objects.values_list("client_id", flat=True)) == ["c1"]


def test_the_same_client_id_again_is_the_first_answer(user: Any) -> None:
    session = SessionFactory(project__owner=user)
    first = submit(user, session, "same")
    again = submit(user, session, "same", text="something else")

    assert (again.run_id, again.duplicate) == (first.run_id, True)
    assert Run.objects.count() == 1


def test_a_message_while_a_run_is_active_becomes_an_intent(user: Any) -> None:
    session = SessionFactory(project__owner=user)
    active = RunFactory(session=session, status=RunStatus.RUNNING)

    result = submit(user, session, "q1")

    assert (result.kind, result.run_id) == ("queue", None)
    assert PendingIntent.objects.get(pk=result.intent_id).session_id == session.pk
    assert list(Run.objects.values_list("pk", flat=True)) == [active.pk]


def test_the_client_id_of_a_queued_intent_is_that_intent_again(user: Any) -> None:
    session = SessionFactory(project__owner=user)
    active = RunFactory(session=session, status=RunStatus.RUNNING)
    queued = submit(user, session, "q1")
    Run.objects.filter(pk=active.pk).update(status=RunStatus.COMPLETED)

    again = submit(user, session, "q1")

    assert (again.kind, again.intent_id, again.duplicate) == ("queue", queued.intent_id, True)
    assert Run.objects.count() == 1


def test_an_archived_session_refuses_and_writes_nothing(user: Any) -> None:
    session = SessionFactory(project__owner=user, status=SessionStatus.ARCHIVED)

    with pytest.raises(services.SubmitRefused) as refused:
        submit(user, session, "c1")

    assert refused.value.code == "session_archived"
    assert not Run.objects.exists()


def test_another_users_session_does_not_exist_for_them(user: Any, other_user: Any, staff_user: Any) -> None:
    session = SessionFactory(project__owner=other_user)

    with pytest.raises(Session.DoesNotExist):
        submit(user, session, "c1")
    # Staff too: staff act on others' sessions only through the admin.
    with pytest.raises(Session.DoesNotExist):
        submit(staff_user, session, "c2")
    assert not Run.objects.exists()


def submit_at_once(user: Any, session: Any, client_ids: list[str]) -> list[Any]:
    """Each client id submitted from a thread of its own, released together; answers or errors."""
    barrier = threading.Barrier(len(client_ids))
    answers: list[Any] = [None] * len(client_ids)

    def send(slot: int) -> None:
        try:
            barrier.wait(10)
            answers[slot] = submit(user, session, client_ids[slot])
        except Exception as exc:  # surfaced by the caller's assertions
            answers[slot] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=send, args=(slot,)) for slot in range(len(client_ids))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return answers


@pytest.mark.parametrize("same_client_id", [False, True], ids=["two-messages", "one-message-twice"])
def test_simultaneous_submits_to_an_idle_session_start_one_turn(user: Any, same_client_id: bool) -> None:
    # Whichever interleaving the two commits get, the database's constraints decide: one
    # turn, and the other message queued behind it (or answered as the repeat it is).
    for round_ in range(8):
        session = SessionFactory(project__owner=user)
        ids = [f"r{round_}"] * 2 if same_client_id else [f"r{round_}-a", f"r{round_}-b"]

        answers = submit_at_once(user, session, ids)

        assert Run.objects.filter(session=session).count() == 1, answers
        kinds = sorted(answer.kind for answer in answers)
        if same_client_id:
            assert kinds == ["run", "run"]
            assert sorted(answer.duplicate for answer in answers) == [False, True]
            assert answers[0].run_id == answers[1].run_id
        else:
            assert kinds == ["queue", "run"]
            assert PendingIntent.objects.filter(session=session).count() == 1
