"""The discovery API without a runner: jobs are durable requests, scoped to their project's owner."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from runs.discovery import ImportedHistory, write_import
from runs.models import AgentJob, AgentJobKind, AgentJobState
from tests import factories

pytestmark = pytest.mark.django_db


def discovered(project: Any, *agent_session_ids: str) -> AgentJob:
    """A finished discovery of `project` that listed these agent sessions."""
    sessions = [
        {"agent_session_id": sid, "cwd": project.path, "title": sid, "updated_at": None}
        for sid in agent_session_ids
    ]
    return AgentJob.objects.create(
        project=project,
        kind=AgentJobKind.LIST_SESSIONS,
        state=AgentJobState.DONE,
        result={"sessions": sessions, "truncated": False},
        finished_at=timezone.now(),
    )


def post_import(client: Client, project: Any, agent_session_id: Any) -> Any:
    return client.post(
        f"/api/projects/{project.pk}/import",
        {"agent_session_id": agent_session_id},
        content_type="application/json",
    )


def test_discover_answers_a_pending_job_at_once(api: Client, project: Any, user: Any) -> None:
    response = api.post(f"/api/projects/{project.pk}/discover")
    assert response.status_code == 202
    body = response.json()
    assert body["kind"] == "list_sessions" and body["state"] == "pending"
    assert body["project_id"] == project.pk and body["result"] is None and body["error"] is None
    job = AgentJob.objects.get(pk=body["id"])
    assert job.requested_by == user
    assert api.get(f"/api/jobs/{job.pk}").json()["state"] == "pending"


def test_a_second_import_request_for_the_same_agent_session_reuses_the_open_job(
    api: Client, project: Any
) -> None:
    discovered(project, "sess-1", "sess-2")
    first = post_import(api, project, "sess-1").json()
    second = post_import(api, project, "sess-1").json()
    other = post_import(api, project, "sess-2").json()
    assert first["id"] == second["id"] != other["id"]
    assert first["payload"] == {"agent_session_id": "sess-1"}
    assert AgentJob.objects.filter(kind=AgentJobKind.IMPORT_SESSION).count() == 2


def test_importing_an_already_imported_session_answers_the_same_session_without_a_runner(
    api: Client, project: Any
) -> None:
    session, created = write_import(project.pk, "sess-9", ImportedHistory(turns=[]), "demo")
    assert created
    body = post_import(api, project, "sess-9").json()
    assert body["state"] == "done"
    assert body["result"] == {
        "session_id": session.pk,
        "agent_session_id": "sess-9",
        "created": False,
        "turns": 0,
    }


def test_only_an_id_the_latest_discovery_listed_is_imported(
    api: Client, project: Any, other_user: Any
) -> None:
    """Issue 22: any other id answers 404 and makes no job, so it never reaches session/load."""
    assert post_import(api, project, "never-listed").status_code == 404  # no discovery at all
    discovered(project, "old-one")
    discovered(project, "new-one")
    response = post_import(api, project, "old-one")  # listed, but not by the latest discovery
    assert response.status_code == 404 and response.json()["code"] == "not_found"
    # Listed for another project (another user's) is not listed for this one.
    discovered(factories.ProjectFactory(owner=other_user), "theirs")
    assert post_import(api, project, "theirs").status_code == 404
    assert not AgentJob.objects.filter(kind=AgentJobKind.IMPORT_SESSION).exists()
    assert post_import(api, project, "new-one").status_code == 202


def test_a_failed_job_reports_its_error_in_the_api_error_shape(api: Client, project: Any) -> None:
    job = AgentJob.objects.create(
        project=project,
        kind=AgentJobKind.LIST_SESSIONS,
        state=AgentJobState.FAILED,
        error_code="list_unsupported",
        error="Agent 'x' does not list its sessions.",
    )
    body = api.get(f"/api/jobs/{job.pk}").json()
    assert body["error"] == {"code": "list_unsupported", "message": "Agent 'x' does not list its sessions."}
    assert body["result"] is None


def test_a_listing_says_which_sessions_this_project_already_holds(api: Client, project: Any) -> None:
    session, _ = write_import(project.pk, "known", ImportedHistory(turns=[]), "demo")
    job = AgentJob.objects.create(
        project=project,
        kind=AgentJobKind.LIST_SESSIONS,
        state=AgentJobState.DONE,
        result={
            "sessions": [
                {"agent_session_id": "known", "cwd": project.path, "title": "A", "updated_at": None},
                {"agent_session_id": "new", "cwd": project.path, "title": "B", "updated_at": None},
            ],
            "truncated": False,
        },
    )
    sessions = api.get(f"/api/jobs/{job.pk}").json()["result"]["sessions"]
    assert [(s["agent_session_id"], s["session_id"]) for s in sessions] == [
        ("known", session.pk),
        ("new", None),
    ]


def test_someone_elses_project_and_jobs_are_not_found(api: Client, other_user: Any) -> None:
    theirs = factories.ProjectFactory(owner=other_user)
    job = AgentJob.objects.create(project=theirs, kind=AgentJobKind.LIST_SESSIONS)
    assert api.post(f"/api/projects/{theirs.pk}/discover").status_code == 404
    assert post_import(api, theirs, "x").status_code == 404
    response = api.get(f"/api/jobs/{job.pk}")
    assert response.status_code == 404 and response.json()["code"] == "not_found"
    assert AgentJob.objects.count() == 1


def test_staff_see_only_their_own_jobs(project: Any, staff_user: Any) -> None:
    job = AgentJob.objects.create(project=project, kind=AgentJobKind.LIST_SESSIONS)
    client = Client()
    client.force_login(staff_user)
    assert client.get(f"/api/jobs/{job.pk}").status_code == 404


@pytest.mark.parametrize("value", ["", "x" * 201, None])
def test_an_import_needs_an_agent_session_id(api: Client, project: Any, value: Any) -> None:
    response = post_import(api, project, value)
    assert response.status_code == 422
    assert response.json()["details"][0]["field"] == "agent_session_id"


def test_discovery_needs_a_signed_in_caller(anonymous: Client, project: Any) -> None:
    assert anonymous.post(f"/api/projects/{project.pk}/discover").status_code == 401
    assert anonymous.get("/api/jobs/1").status_code == 401
