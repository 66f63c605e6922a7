"""Archiving over the API: sessions (archive, restore, the archived list) and projects (hidden from the
default list, their sessions refusing new messages with 409 `project_archived`, restored).

The browser's side is tests/test_browser_archive.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from intents.models import PendingIntent
from projects.models import Project, ProjectStatus, Session, SessionStatus
from runs import services
from runs.models import Run, RunStatus
from tests.factories import ProjectFactory, RunFactory, SessionFactory, WorkflowFactory

pytestmark = pytest.mark.django_db

JSON = "application/json"


def patch(api: Client, url: str, **body: Any) -> Any:
    return api.patch(url, body, content_type=JSON)


def send(api: Client, session: Any, client_id: str = "c1", **extra: Any) -> Any:
    body = {"client_id": client_id, "text": "Run the tests", **extra}
    return api.post(f"/api/sessions/{session.pk}/messages", body, content_type=JSON)


def archived_project(user: Any) -> Any:
    return ProjectFactory(owner=user, status=ProjectStatus.ARCHIVED)


# ---------------------------------------------------------------- sessions


def test_an_archived_session_keeps_its_transcript_refuses_messages_and_is_restored(
    api: Client, session: Any
) -> None:
    RunFactory(session=session, client_id="c0", status=RunStatus.COMPLETED)
    url = f"/api/sessions/{session.pk}"

    assert patch(api, url, status="archived").json()["status"] == "archived"
    refused = send(api, session)
    assert refused.status_code == 409 and refused.json()["code"] == "session_archived"
    assert api.get(f"{url}/transcript").json()["turns"][0]["client_id"] == "c0"

    assert patch(api, url, status="active").json()["status"] == "active"
    assert send(api, session).status_code == 202
    assert Run.objects.filter(session=session).count() == 2


def test_a_repeated_message_to_a_session_archived_since_still_answers_its_first_answer(
    api: Client, session: Any
) -> None:
    first = send(api, session).json()
    patch(api, f"/api/sessions/{session.pk}", status="archived")
    again = send(api, session)
    assert again.status_code == 202
    assert again.json()["duplicate"] is True and again.json()["run_id"] == first["run_id"]


def test_archiving_a_session_with_a_run_in_progress_lets_the_run_finish(api: Client, session: Any) -> None:
    run = RunFactory(session=session, status=RunStatus.RUNNING)
    assert patch(api, f"/api/sessions/{session.pk}", status="archived").status_code == 200
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING
    # Nor can anything be queued behind it.
    assert send(api, session, mode="queue").json()["code"] == "session_archived"
    assert not PendingIntent.objects.filter(session=session).exists()


def test_the_session_list_filters_by_status(api: Client, project: Any) -> None:
    active = SessionFactory(project=project)
    archived = SessionFactory(project=project, status=SessionStatus.ARCHIVED)
    url = f"/api/projects/{project.pk}/sessions"

    assert {s["id"] for s in api.get(url).json()} == {active.pk, archived.pk}
    assert [s["id"] for s in api.get(f"{url}?status=active").json()] == [active.pk]
    only = api.get(f"{url}?status=archived").json()
    assert [(s["id"], s["status"]) for s in only] == [(archived.pk, "archived")]


@pytest.mark.parametrize("value", ["deleted", "ARCHIVED", ""])
def test_an_unknown_session_status_is_a_422_naming_the_field(api: Client, session: Any, value: str) -> None:
    response = patch(api, f"/api/sessions/{session.pk}", status=value)
    assert response.status_code == 422
    assert response.json()["details"][0]["field"] == "status"
    response = api.get(f"/api/projects/{session.project_id}/sessions?status={value}")
    assert response.status_code == 422 and response.json()["code"] == "validation_error"
    assert Session.objects.get(pk=session.pk).status == SessionStatus.ACTIVE


def test_someone_elses_session_cannot_be_archived(api: Client, other_user: Any) -> None:
    theirs = SessionFactory(project__owner=other_user)
    response = patch(api, f"/api/sessions/{theirs.pk}", status="archived")
    assert response.status_code == 404 and response.json()["code"] == "not_found"
    assert Session.objects.get(pk=theirs.pk).status == SessionStatus.ACTIVE


# ---------------------------------------------------------------- projects


def test_a_new_project_is_active(api: Client, project: Any) -> None:
    assert api.get(f"/api/projects/{project.pk}").json()["status"] == "active"


def test_an_archived_project_leaves_the_default_list_and_is_restored(
    api: Client, user: Any, project: Any
) -> None:
    other = ProjectFactory(owner=user)
    url = f"/api/projects/{project.pk}"

    body = patch(api, url, status="archived").json()
    assert body["status"] == "archived" and body["name"] == project.name
    assert [p["id"] for p in api.get("/api/projects").json()] == [other.pk]
    listed = {p["id"]: p["status"] for p in api.get("/api/projects?include_archived=1").json()}
    assert listed == {project.pk: "archived", other.pk: "active"}
    assert [p["id"] for p in api.get("/api/projects?include_archived=false").json()] == [other.pk]
    # Still there by id: its page and its sessions are read as ever.
    assert api.get(url).json()["status"] == "archived"
    assert api.get(f"{url}/sessions").status_code == 200

    assert patch(api, url, status="active").json()["status"] == "active"
    assert {p["id"] for p in api.get("/api/projects").json()} == {project.pk, other.pk}


def test_archiving_keeps_the_other_fields_and_they_can_still_be_edited(api: Client, project: Any) -> None:
    url = f"/api/projects/{project.pk}"
    patch(api, url, status="archived")
    body = patch(api, url, name="Old work").json()
    assert (body["name"], body["status"]) == ("Old work", "archived")


@pytest.mark.parametrize("value", ["deleted", "Archived", 1])
def test_an_unknown_project_status_is_a_422(api: Client, project: Any, value: Any) -> None:
    response = patch(api, f"/api/projects/{project.pk}", status=value)
    assert response.status_code == 422
    assert response.json()["code"] == "validation_error"
    assert response.json()["details"][0]["field"] == "status"
    assert Project.objects.get(pk=project.pk).status == ProjectStatus.ACTIVE


def test_a_bad_include_archived_is_a_422(api: Client) -> None:
    response = api.get("/api/projects?include_archived=perhaps")
    assert response.status_code == 422 and response.json()["code"] == "validation_error"


def test_someone_elses_project_cannot_be_archived_nor_listed(api: Client, other_user: Any) -> None:
    theirs = ProjectFactory(owner=other_user, status=ProjectStatus.ARCHIVED)
    assert patch(api, f"/api/projects/{theirs.pk}", status="active").status_code == 404
    assert api.get("/api/projects?include_archived=1").json() == []
    assert Project.objects.get(pk=theirs.pk).status == ProjectStatus.ARCHIVED


def test_a_message_to_a_session_of_an_archived_project_is_a_409(api: Client, user: Any) -> None:
    session = SessionFactory(project=archived_project(user))
    response = send(api, session)
    assert response.status_code == 409
    assert response.json()["code"] == "project_archived"
    assert not Run.objects.filter(session=session).exists()


def test_nothing_is_queued_or_steered_in_an_archived_project(api: Client, user: Any) -> None:
    session = SessionFactory(project=archived_project(user))
    RunFactory(session=session, status=RunStatus.RUNNING)
    for mode in ("queue", "steer", "auto"):
        assert send(api, session, client_id=f"c-{mode}", mode=mode).json()["code"] == "project_archived"
    assert not PendingIntent.objects.filter(session=session).exists()


def test_the_project_refusal_comes_first_when_both_are_archived(api: Client, user: Any) -> None:
    session = SessionFactory(project=archived_project(user), status=SessionStatus.ARCHIVED)
    assert send(api, session).json()["code"] == "project_archived"


def test_a_repeated_message_to_a_project_archived_since_still_answers_its_first_answer(
    api: Client, session: Any
) -> None:
    first = send(api, session).json()
    patch(api, f"/api/projects/{session.project_id}", status="archived")
    again = send(api, session).json()
    assert again["duplicate"] is True and again["run_id"] == first["run_id"]


def test_no_session_is_started_in_an_archived_project(api: Client, user: Any) -> None:
    project = archived_project(user)
    response = api.post(f"/api/projects/{project.pk}/sessions", {"title": "x"}, content_type=JSON)
    assert response.status_code == 409 and response.json()["code"] == "project_archived"
    assert not Session.objects.filter(project=project).exists()


def test_a_workflow_of_an_archived_project_launches_nothing(api: Client, user: Any) -> None:
    workflow = WorkflowFactory(project=archived_project(user), prompt_template="Do it")
    response = api.post(f"/api/workflows/{workflow.pk}/launch", {"variables": {}}, content_type=JSON)
    assert response.status_code == 409 and response.json()["code"] == "project_archived"
    assert not Session.objects.filter(project=workflow.project).exists()


def test_restoring_the_project_takes_messages_again(api: Client, user: Any) -> None:
    project = archived_project(user)
    session = SessionFactory(project=project)
    assert send(api, session).status_code == 409
    patch(api, f"/api/projects/{project.pk}", status="active")
    assert send(api, session).status_code == 202


def test_the_domain_refuses_every_submitter_not_only_the_api(user: Any) -> None:
    session = SessionFactory(project=archived_project(user))
    with pytest.raises(services.SubmitRefused) as refused:
        services.do_submit_message(session, client_id="c1", text="hi")
    assert (refused.value.code, refused.value.status) == ("project_archived", 409)


@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_the_one_statement_path_refuses_too(api: Client, user: Any) -> None:
    """On PostgreSQL a message outside a transaction takes the one-statement path first."""
    session = SessionFactory(project=archived_project(user))
    response = send(api, session)
    assert response.status_code == 409 and response.json()["code"] == "project_archived"
    assert not Run.objects.filter(session=session).exists()
