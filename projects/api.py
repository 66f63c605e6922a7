"""Projects, workflows and sessions. Thin views: parse, authorize, act, serialise."""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from ninja import Query, Router, Status

from hermesweb.auth import get_visible
from hermesweb.errors import ApiError
from projects import services
from projects.models import Project, Session, Workflow
from projects.prompts import TemplateLimit
from projects.schemas import (
    LaunchIn,
    ProjectFilter,
    ProjectIn,
    ProjectOut,
    ProjectPatch,
    SessionFilter,
    SessionIn,
    SessionOut,
    SessionPatch,
    WorkflowIn,
    WorkflowOut,
    WorkflowPatch,
)
from runs import services as run_services
from runs.capacity import waiting_of_session
from runs.models import Run
from runs.schemas import SubmitOut
from runs.usage import session_usage
from worktrees.services import do_create_worktree_session

router = Router()


def changes(payload: Any) -> dict[str, Any]:
    # PATCH: omitted and null both mean "leave as it is"; no field here is nullable.
    return {k: v for k, v in payload.model_dump(exclude_unset=True).items() if v is not None}


def with_active_run(sessions: QuerySet[Session]) -> QuerySet[Session]:
    active = Run.objects.filter(session=OuterRef("pk")).active().values("pk")[:1]
    return sessions.annotate(active_run_id=Subquery(active))


# ---------------------------------------------------------------- projects


@router.get("/projects", response=list[ProjectOut], tags=["projects"])
def list_projects(request: HttpRequest, filters: Query[ProjectFilter]) -> QuerySet[Project]:
    """Your own projects (staff too; others' are in the admin); archived ones only with `include_archived`."""
    projects = Project.objects.visible_to(request.auth)
    return projects if filters.include_archived else projects.active()


@router.post("/projects", response={201: ProjectOut}, tags=["projects"])
def create_project(request: HttpRequest, payload: ProjectIn) -> Status[Project]:
    """Create a project. 422 `path_*` for a refused path, `unknown_agent` for an unconfigured agent;
    409 `path_taken` for a path that equals, contains or sits inside another user's project,
    `too_many_projects` past HERMESWEB_MAX_PROJECTS_PER_USER."""
    project = services.do_create_project(request.auth, **payload.model_dump())
    return Status(201, project)


@router.get("/projects/{id}", response=ProjectOut, tags=["projects"])
def get_project(request: HttpRequest, id: int) -> Project:
    return get_visible(Project.objects, request.auth, id, "project")


@router.patch("/projects/{id}", response=ProjectOut, tags=["projects"])
def update_project(request: HttpRequest, id: int, payload: ProjectPatch) -> Project:
    """Change fields; a new path is validated as on create (422 `path_*`, 409 `path_taken`).

    `status`: `archived` hides the project from the default list and refuses new messages to its
    sessions (409 `project_archived`); `active` restores it.
    """
    project = get_visible(Project.objects, request.auth, id, "project")
    return services.do_update_project(project, **changes(payload))


@router.delete("/projects/{id}", response={204: None}, tags=["projects"])
def delete_project(request: HttpRequest, id: int) -> Status[None]:
    """Delete a project and everything under it. 409 `conflict` while one of its runs is active."""
    project = get_visible(Project.objects, request.auth, id, "project")
    services.do_delete_project(project)
    return Status(204, None)


# ---------------------------------------------------------------- workflows


@router.get("/projects/{id}/workflows", response=list[WorkflowOut], tags=["workflows"])
def list_workflows(request: HttpRequest, id: int) -> QuerySet[Workflow]:
    project = get_visible(Project.objects, request.auth, id, "project")
    return project.workflows.all()


@router.post("/projects/{id}/workflows", response={201: WorkflowOut}, tags=["workflows"])
def create_workflow(request: HttpRequest, id: int, payload: WorkflowIn) -> Status[Workflow]:
    """Create a workflow. 422 `invalid_template` for a template that cannot render."""
    project = get_visible(Project.objects, request.auth, id, "project")
    workflow = services.do_create_workflow(project, **payload.model_dump())
    return Status(201, workflow)


@router.get("/workflows/{id}", response=WorkflowOut, tags=["workflows"])
def get_workflow(request: HttpRequest, id: int) -> Workflow:
    return get_visible(Workflow.objects, request.auth, id, "workflow")


@router.patch("/workflows/{id}", response=WorkflowOut, tags=["workflows"])
def update_workflow(request: HttpRequest, id: int, payload: WorkflowPatch) -> Workflow:
    workflow = get_visible(Workflow.objects, request.auth, id, "workflow")
    return services.do_update_workflow(workflow, **changes(payload))


@router.delete("/workflows/{id}", response={204: None}, tags=["workflows"])
def delete_workflow(request: HttpRequest, id: int) -> Status[None]:
    workflow = get_visible(Workflow.objects, request.auth, id, "workflow")
    services.do_delete_workflow(workflow)
    return Status(204, None)


@router.post("/workflows/{id}/launch", response={202: SubmitOut}, tags=["workflows"])
def launch_workflow(request: HttpRequest, id: int, payload: LaunchIn) -> Status[SubmitOut]:
    """Render the template with `variables` and send it as a turn, in `session_id` or a new session.

    422 `missing_variables` names the variables not given, `prompt_too_large` for a prompt past
    projects.prompts.MAX_PROMPT_CHARS; 409 `session_archived` for an archived session,
    `project_archived` for an archived project (no session is created). The answer has the
    shape of `POST /sessions/{id}/messages`.

    The workflow's `agent_mode` and `agent_model`, where set, become the session's (a new one
    starts with them) and reach the agent before this turn; 422 `unknown_mode` for a mode the
    given session's agent did not report.
    """
    workflow = get_visible(Workflow.objects.select_related("project"), request.auth, id, "workflow")
    session = None
    if payload.session_id is not None:
        session = get_visible(Session.objects, request.auth, payload.session_id, "session")
        if session.project_id != workflow.project_id:
            raise ApiError(422, "wrong_project", "The session belongs to another project than the workflow.")
        session = services.do_apply_workflow_settings(session, workflow)
    client_id = payload.client_id or uuid.uuid4().hex
    try:
        if payload.worktree and session is None:
            session = launched_in_worktree(workflow, payload, client_id)
        result = run_services.do_launch_workflow(
            workflow,
            session=session,
            variables=payload.variables,
            client_id=client_id,
        )
    except KeyError as exc:
        missing = str(exc.args[0]) if exc.args else ""
        names = [name.strip() for name in missing.split(",") if name.strip()]
        raise ApiError(
            422, "missing_variables", f"Missing variables: {missing}.", {"missing": names}
        ) from None
    except TemplateLimit:
        raise  # a refusal with its own code (hermesweb.errors), though a ValueError too
    except ValueError as exc:
        raise ApiError(422, "invalid_template", f"The workflow's template cannot render: {exc}") from None
    return Status(202, SubmitOut.from_result(result))


def launched_in_worktree(workflow: Workflow, payload: LaunchIn, client_id: str) -> Session:
    """A launch's new session in its own worktree (docs/worktrees.md); the one a repeated
    `client_id` made before. The template's refusals come first: nothing is written then."""
    again = Session.objects.filter(project=workflow.project, runs__client_id=client_id).first()
    if again is not None:
        return again
    workflow.render(payload.variables)
    branch, base = payload.branch, payload.base
    made = do_create_worktree_session(workflow.project, title=workflow.name, branch=branch, base=base)
    return services.do_apply_workflow_settings(made, workflow)


# ---------------------------------------------------------------- sessions


@router.get("/projects/{id}/sessions", response=list[SessionOut], tags=["sessions"])
def list_sessions(request: HttpRequest, id: int, filters: Query[SessionFilter]) -> QuerySet[Session]:
    """The project's sessions, most recently active first, each with its active run id.

    `status` keeps only the active or only the archived ones (default: both).
    """
    project = get_visible(Project.objects, request.auth, id, "project")
    sessions = project.sessions.all()
    if filters.status is not None:
        sessions = sessions.filter(status=filters.status)
    return with_active_run(sessions)


@router.post("/projects/{id}/sessions", response={201: SessionOut}, tags=["sessions"])
def create_session(request: HttpRequest, id: int, payload: SessionIn) -> Status[Session]:
    """An empty session. 409 `project_archived` in an archived project, `too_many_sessions` past
    HERMESWEB_MAX_SESSIONS_PER_USER.

    With `worktree: true` it works in a git worktree of its own on a new `branch` from `base`
    (docs/worktrees.md): 422 `not_a_git_repository`, `invalid_branch`, `invalid_base`; 409
    `branch_exists`."""
    project = get_visible(Project.objects, request.auth, id, "project")
    if payload.worktree:
        branch, base = payload.branch, payload.base
        return Status(201, do_create_worktree_session(project, title=payload.title, branch=branch, base=base))
    return Status(201, services.do_create_session(project, title=payload.title))


@router.get("/sessions/{id}", response=SessionOut, tags=["sessions"])
def get_session(request: HttpRequest, id: int) -> Session:
    """One session, with its `usage` totals (runs/usage.py)."""
    session = get_visible(with_active_run(Session.objects.all()), request.auth, id, "session")
    session.usage_total = session_usage(session.pk)  # type: ignore[attr-defined]
    session.waiting = waiting_of_session(session)  # type: ignore[attr-defined]
    return session


@router.patch("/sessions/{id}", response=SessionOut, tags=["sessions"])
def update_session(request: HttpRequest, id: int, payload: SessionPatch) -> Session:
    """Rename (`title`), archive or restore (`status`: `archived` | `active`), choose `mode` or `model`.

    An archived session keeps its transcript and refuses new messages (409 `session_archived`).
    `mode` must be one of the session's `modes` (what the agent reported), else 422
    `unknown_mode` — also before the first turn, when the agent has reported none yet. `model`
    is free text (at most 200 characters; `models` lists the agent's suggestions): an id the
    agent refuses fails the next turn with `model_refused`. Both are sent to the agent
    (`session/set_mode`, `session/set_model`) before the session's next turn, never into a turn
    already running, and show on that turn's `run.started`; "" clears the choice. `config` chooses
    among the session's `config_options` likewise (session/set_config_option; 422
    `unknown_config_option` / `invalid_config_value`; docs/agents.md, "Config options").
    """
    session = get_visible(Session.objects, request.auth, id, "session")
    return services.do_update_session(session, **changes(payload))


@router.delete("/sessions/{id}", response={204: None}, tags=["sessions"])
def delete_session(request: HttpRequest, id: int) -> Status[None]:
    """Delete a session with its runs and journal. 409 `conflict` while a run is active."""
    session = get_visible(Session.objects, request.auth, id, "session")
    services.do_delete_session(session)
    return Status(204, None)
