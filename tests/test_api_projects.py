"""Projects and workflows over the API: CRUD, path and agent validation, visibility, launch."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from projects.models import Project, Session, Workflow
from runs.models import Run, RunSource, RunStatus
from tests.conftest import token_client
from tests.factories import ProjectFactory, RunFactory, SessionFactory, WorkflowFactory

pytestmark = pytest.mark.django_db

JSON = "application/json"


def create(api: Client, **body: Any) -> Any:
    return api.post("/api/projects", body, content_type=JSON)


def workspace(root: Path, name: str = "repo") -> str:
    path = root / name
    path.mkdir(exist_ok=True)
    return str(path)


# ---------------------------------------------------------------- create


def test_it_creates_a_project_with_the_default_agent_and_a_slug(
    api: Client, user: Any, allowed_root: Path
) -> None:
    response = create(api, name="My App", path=workspace(allowed_root))

    assert response.status_code == 201
    body = response.json()
    assert body["name"] == "My App"
    assert body["slug"] == "my-app"
    assert body["agent"] == "demo"
    assert body["running_default"] == "queue"
    assert body["path"] == str((allowed_root / "repo").resolve())
    assert Project.objects.get(pk=body["id"]).owner == user


def test_slugs_are_unique_per_owner(api: Client, allowed_root: Path, other_user: Any) -> None:
    ProjectFactory(owner=other_user, slug="app")
    slugs = [create(api, name="App", path=workspace(allowed_root)).json()["slug"] for _ in range(3)]

    assert slugs == ["app", "app-2", "app-3"]


def test_a_name_without_slug_characters_gets_a_generic_slug(api: Client, allowed_root: Path) -> None:
    assert create(api, name="日本語", path=workspace(allowed_root)).json()["slug"] == "project"


def test_it_stores_the_resolved_path(api: Client, allowed_root: Path) -> None:
    target = Path(workspace(allowed_root, "real"))
    os.symlink(target, allowed_root / "link")

    response = create(api, name="Linked", path=str(allowed_root / "link"))
    assert response.json()["path"] == str(target.resolve())


@pytest.mark.parametrize(
    ("make_path", "code"),
    [
        (lambda root, tmp: "relative/dir", "path_not_absolute"),
        (lambda root, tmp: f"{root}/repo/../repo", "path_traversal"),
        (lambda root, tmp: f"{root}/missing", "path_not_directory"),
        (lambda root, tmp: str(tmp), "path_outside_roots"),
        (lambda root, tmp: "/etc", "path_outside_roots"),
    ],
    ids=["relative", "dotdot", "missing", "outside", "etc"],
)
def test_it_refuses_a_path_outside_the_rules(
    api: Client, allowed_root: Path, tmp_path: Path, make_path: Any, code: str
) -> None:
    workspace(allowed_root)
    response = create(api, name="Bad", path=make_path(allowed_root, tmp_path))

    assert response.status_code == 422
    assert response.json()["code"] == code
    assert response.json()["details"][0]["field"] == "path"
    assert not Project.objects.exists()


def test_it_refuses_a_symlink_that_leaves_the_allowed_roots(
    api: Client, allowed_root: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, allowed_root / "escape")

    response = create(api, name="Escape", path=str(allowed_root / "escape"))
    assert response.status_code == 422
    assert response.json()["code"] == "path_outside_roots"


def test_it_refuses_an_unknown_agent(api: Client, allowed_root: Path) -> None:
    response = create(api, name="X", path=workspace(allowed_root), agent="rm -rf /")

    assert response.status_code == 422
    assert response.json()["code"] == "unknown_agent"
    assert response.json()["details"][0]["field"] == "agent"


def test_it_accepts_a_configured_agent_and_running_default(api: Client, allowed_root: Path) -> None:
    response = create(api, name="X", path=workspace(allowed_root), agent="hermes", running_default="steer")
    assert response.status_code == 201
    assert (response.json()["agent"], response.json()["running_default"]) == ("hermes", "steer")


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"name": "", "path": "/x"},
        {"name": "x" * 201, "path": "/x"},
        {"name": 5, "path": "/x"},
        {"name": "x", "path": ["/x"]},
        {"name": "x", "path": "/x", "running_default": "sometimes"},
    ],
)
def test_schema_violations_are_422_naming_the_fields(api: Client, body: dict[str, Any]) -> None:
    response = create(api, **body)

    assert response.status_code == 422
    assert response.json()["code"] == "validation_error"
    assert response.json()["details"]
    assert all({"field", "message", "type"} <= set(d) for d in response.json()["details"])


@pytest.mark.parametrize(
    "raw", [b"", b"not json", b"{", b"[1, 2]", b"42", b"null", b'"text"', b'{"name": "\\u0000"}', b"\xff"]
)
def test_junk_bodies_are_answered_in_json_never_a_500(api: Client, raw: bytes) -> None:
    response = api.post("/api/projects", raw, content_type=JSON)

    assert response.status_code in (400, 422)
    assert response.json()["code"] in ("invalid_json", "validation_error")


def test_a_nul_character_anywhere_in_a_body_is_refused(api: Client, session: Any) -> None:
    response = api.post(
        f"/api/sessions/{session.pk}/messages",
        '{"client_id": "c1", "text": "hi", "attachments": [{"name": "a\\u0000b"}]}',
        content_type=JSON,
    )
    assert response.status_code == 400
    assert "NUL" in response.json()["message"]


def test_a_form_encoded_body_is_refused_as_not_json(api: Client) -> None:
    response = api.post("/api/projects", {"name": "x", "path": "/x"})
    assert response.status_code == 400


def test_an_oversized_body_is_a_413(api: Client, settings: Any) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = api.post("/api/projects", {"name": "x" * 2000, "path": "/x"}, content_type=JSON)
    assert response.status_code == 413
    assert response.json()["code"] == "payload_too_large"


# ---------------------------------------------------------------- read, update, delete


def test_it_lists_only_the_callers_projects(api: Client, user: Any, other_user: Any) -> None:
    mine = ProjectFactory(owner=user, name="b")
    also_mine = ProjectFactory(owner=user, name="a")
    ProjectFactory(owner=other_user)

    assert [p["id"] for p in api.get("/api/projects").json()] == [also_mine.pk, mine.pk]


def test_staff_see_only_their_own_projects(staff_user: Any, user: Any, other_user: Any) -> None:
    ProjectFactory(owner=user)
    ProjectFactory(owner=other_user)
    own = ProjectFactory(owner=staff_user)
    assert [p["id"] for p in token_client(staff_user).get("/api/projects").json()] == [own.pk]


@pytest.mark.parametrize("method", ["get", "patch", "delete"])
def test_someone_elses_project_is_a_404_not_a_403(api: Client, other_user: Any, method: str) -> None:
    theirs = ProjectFactory(owner=other_user)
    response = getattr(api, method)(f"/api/projects/{theirs.pk}", {"name": "mine now"}, content_type=JSON)

    assert response.status_code == 404
    assert response.json() == {"code": "not_found", "message": "No such project."}
    theirs.refresh_from_db()
    assert theirs.name != "mine now"


@pytest.mark.parametrize("pk", ["0", "-1", "999999", str(2**63), str(10**40)])
def test_unknown_and_impossible_ids_are_404(api: Client, pk: str) -> None:
    response = api.get(f"/api/projects/{pk}")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_a_non_numeric_id_is_a_422(api: Client) -> None:
    response = api.get("/api/projects/abc")
    assert response.status_code == 422
    assert response.json()["details"][0]["field"] == "id"


def test_it_updates_only_the_fields_sent(api: Client, project: Any, allowed_root: Path) -> None:
    new_path = workspace(allowed_root, "moved")
    response = api.patch(f"/api/projects/{project.pk}", {"path": new_path, "name": None}, content_type=JSON)

    assert response.status_code == 200
    project.refresh_from_db()
    assert project.path == new_path
    assert response.json()["name"] == project.name
    assert response.json()["slug"] == project.slug


def test_an_update_validates_path_and_agent_again(api: Client, project: Any) -> None:
    bad_path = api.patch(f"/api/projects/{project.pk}", {"path": "/etc"}, content_type=JSON)
    bad_agent = api.patch(f"/api/projects/{project.pk}", {"agent": "nope"}, content_type=JSON)

    assert (bad_path.status_code, bad_path.json()["code"]) == (422, "path_outside_roots")
    assert (bad_agent.status_code, bad_agent.json()["code"]) == (422, "unknown_agent")


def test_it_deletes_a_project_with_everything_under_it(api: Client, project: Any) -> None:
    RunFactory(session=SessionFactory(project=project), status=RunStatus.COMPLETED)

    response = api.delete(f"/api/projects/{project.pk}")

    assert response.status_code == 204
    assert not Project.objects.filter(pk=project.pk).exists()
    assert not Run.objects.exists()


def test_it_refuses_to_delete_a_project_with_an_active_run(api: Client, project: Any) -> None:
    RunFactory(session=SessionFactory(project=project), status=RunStatus.RUNNING)

    response = api.delete(f"/api/projects/{project.pk}")

    assert response.status_code == 409
    assert response.json()["code"] == "conflict"
    assert Project.objects.filter(pk=project.pk).exists()


# ---------------------------------------------------------------- workflows


def test_it_creates_and_lists_workflows_with_their_variables(api: Client, project: Any) -> None:
    response = api.post(
        f"/api/projects/{project.pk}/workflows",
        {"name": "Review", "prompt_template": "Review {file} for {concern}; {{literal}} {file}"},
        content_type=JSON,
    )

    assert response.status_code == 201
    assert response.json()["variables"] == ["file", "concern"]
    listed = api.get(f"/api/projects/{project.pk}/workflows").json()
    assert [w["name"] for w in listed] == ["Review"]


@pytest.mark.parametrize(
    "template", ["Unbalanced {brace", "Positional {0}", "Attribute {a.b}", "Empty {}", "{x!z}"]
)
def test_it_refuses_a_template_that_cannot_render(api: Client, project: Any, template: str) -> None:
    response = api.post(
        f"/api/projects/{project.pk}/workflows", {"name": "W", "prompt_template": template}, content_type=JSON
    )
    assert response.status_code == 422
    assert response.json()["code"] == "invalid_template"


def test_it_reads_updates_and_deletes_a_workflow(api: Client, project: Any) -> None:
    workflow = WorkflowFactory(project=project)

    assert api.get(f"/api/workflows/{workflow.pk}").json()["name"] == workflow.name
    patched = api.patch(f"/api/workflows/{workflow.pk}", {"prompt_template": "Fix {bug}"}, content_type=JSON)
    assert patched.json()["variables"] == ["bug"]
    assert api.delete(f"/api/workflows/{workflow.pk}").status_code == 204
    assert not Workflow.objects.filter(pk=workflow.pk).exists()


def test_someone_elses_workflows_are_404(api: Client, other_user: Any) -> None:
    theirs = WorkflowFactory(project=ProjectFactory(owner=other_user))

    assert api.get(f"/api/workflows/{theirs.pk}").status_code == 404
    assert api.get(f"/api/projects/{theirs.project_id}/workflows").status_code == 404
    assert (
        api.post(f"/api/workflows/{theirs.pk}/launch", {"variables": {}}, content_type=JSON).status_code
        == 404
    )


def test_launching_a_workflow_starts_a_turn_in_a_new_session(api: Client, project: Any) -> None:
    workflow = WorkflowFactory(project=project, name="Review", prompt_template="Review {file} for {concern}.")

    response = api.post(
        f"/api/workflows/{workflow.pk}/launch",
        {"variables": {"file": "app.py", "concern": "bugs"}},
        content_type=JSON,
    )

    assert response.status_code == 202
    body = response.json()
    assert body["kind"] == "run"
    assert body["duplicate"] is False
    run = Run.objects.get(pk=body["run_id"])
    assert run.prompt_text == "Review app.py for bugs."
    assert run.source == RunSource.WORKFLOW
    assert run.session.project == project
    assert run.session.title == "Review"


def test_launching_into_a_given_session_uses_it(api: Client, project: Any, session: Any) -> None:
    workflow = WorkflowFactory(project=project, prompt_template="Go")

    body = api.post(
        f"/api/workflows/{workflow.pk}/launch", {"session_id": session.pk, "variables": {}}, content_type=JSON
    ).json()

    assert Run.objects.get(pk=body["run_id"]).session == session
    assert Session.objects.count() == 1


def test_launching_again_with_the_same_client_id_is_a_duplicate(api: Client, project: Any) -> None:
    workflow = WorkflowFactory(project=project, prompt_template="Go")
    url = f"/api/workflows/{workflow.pk}/launch"

    first = api.post(url, {"variables": {}, "client_id": "launch-1"}, content_type=JSON).json()
    again = api.post(url, {"variables": {}, "client_id": "launch-1"}, content_type=JSON).json()

    assert again["run_id"] == first["run_id"]
    assert again["duplicate"] is True
    assert Run.objects.count() == 1


def test_launching_without_all_variables_is_a_422_naming_them(api: Client, project: Any) -> None:
    workflow = WorkflowFactory(project=project, prompt_template="Review {file} for {concern} by {who}.")

    response = api.post(
        f"/api/workflows/{workflow.pk}/launch", {"variables": {"concern": "bugs"}}, content_type=JSON
    )

    assert response.status_code == 422
    assert response.json()["code"] == "missing_variables"
    assert response.json()["details"] == {"missing": ["file", "who"]}
    assert not Run.objects.exists()


def test_launching_into_another_projects_session_is_refused(api: Client, user: Any, project: Any) -> None:
    workflow = WorkflowFactory(project=project, prompt_template="Go")
    elsewhere = SessionFactory(project=ProjectFactory(owner=user))

    response = api.post(
        f"/api/workflows/{workflow.pk}/launch",
        {"session_id": elsewhere.pk, "variables": {}},
        content_type=JSON,
    )
    assert response.status_code == 422
    assert response.json()["code"] == "wrong_project"


def test_launching_into_someone_elses_session_is_a_404(api: Client, project: Any, other_user: Any) -> None:
    workflow = WorkflowFactory(project=project, prompt_template="Go")
    theirs = SessionFactory(project=ProjectFactory(owner=other_user))

    response = api.post(
        f"/api/workflows/{workflow.pk}/launch", {"session_id": theirs.pk, "variables": {}}, content_type=JSON
    )
    assert response.status_code == 404


def test_launching_into_an_archived_session_is_a_409(api: Client, project: Any) -> None:
    workflow = WorkflowFactory(project=project, prompt_template="Go")
    archived = SessionFactory(project=project, status="archived")

    response = api.post(
        f"/api/workflows/{workflow.pk}/launch",
        {"session_id": archived.pk, "variables": {}},
        content_type=JSON,
    )
    assert response.status_code == 409
    assert response.json()["code"] == "session_archived"


def test_variables_must_be_strings(api: Client, project: Any) -> None:
    workflow = WorkflowFactory(project=project, prompt_template="{n}")
    response = api.post(f"/api/workflows/{workflow.pk}/launch", {"variables": {"n": 5}}, content_type=JSON)
    assert response.status_code == 422
    assert response.json()["details"][0]["field"] == "variables.n"
