"""Actions on projects, workflows and sessions (design note: docs/domain.md).

Views parse and authorize; these `do_*` functions validate against the
operator's configuration, mutate and emit. Each states its preconditions.
They raise `InvalidInput` (the caller's data is wrong: a 422) or `Conflict`
(the current state forbids it: a 409), never HTTP errors.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils.text import slugify

from projects.models import Project, ProjectStatus, RunningDefault, Session, SessionStatus, Workflow
from projects.paths import PathRefused, validate_project_location
from projects.prompts import TemplateLimit
from projects.refusals import Refused
from projects.session_options import clean_config
from runs.labels import LabelError, parse_labels

_SLUG_MAX = 200
_SLUG_ATTEMPTS = 5


class InvalidInput(Refused, ValueError):
    """422: the caller's data is wrong; with a `field`, the details name it as validation errors do."""

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        details = [{"field": field, "location": "body", "message": message, "type": code}]
        super().__init__(422, code, message, details if field else None)
        self.field = field


class Conflict(Refused):
    """409: the current state forbids the action (`conflict`, or a more specific code)."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(409, "conflict" if code is None else code, message)


# ---------------------------------------------------------------- validation


def clean_path(raw: str, *, owner_id: Any, project_id: int | None = None) -> str:
    """The resolved path under every rule of projects.paths: 422 `path_*`, or 409 `path_taken`."""
    try:
        return str(validate_project_location(raw, owner_id=owner_id, project_id=project_id))
    except PathRefused as exc:
        if exc.status == 409:
            raise Conflict(exc.message, exc.code) from None
        raise InvalidInput(exc.code, exc.message, "path") from None


def clean_agent(name: str | None) -> str:
    if name is None or name == "":
        return settings.HERMESWEB_DEFAULT_AGENT
    if name not in settings.HERMESWEB_AGENTS:
        known = ", ".join(sorted(settings.HERMESWEB_AGENTS))
        raise InvalidInput("unknown_agent", f"Unknown agent {name!r}; configured agents: {known}.", "agent")
    return name


def clean_labels(raw: list[str]) -> list[str]:
    """A project's required runner labels (runs.labels): `word` or `key=value`, sorted, unique."""
    try:
        return list(parse_labels(raw))
    except LabelError as exc:
        raise InvalidInput("invalid_labels", str(exc), "required_labels") from None


def clean_running_default(value: str) -> str:
    if value not in RunningDefault.values:
        raise InvalidInput("validation_error", f"running_default must be one of {RunningDefault.values}.")
    return value


def clean_status(value: str, allowed: list[str]) -> str:
    if value not in allowed:
        raise InvalidInput("validation_error", f"status must be one of {allowed}.", "status")
    return value


def refuse_if_archived(project: Project) -> None:
    """Conflict `project_archived`: an archived project's sessions are read until it is restored."""
    if project.status == ProjectStatus.ARCHIVED:
        raise Conflict("This project is archived; restore it to work in it.", "project_archived")


def clean_template(template: str) -> str:
    """Refuse a template that could never render: unbalanced braces, fields that are not plain names,
    nested fields in a spec; 422 `template_spec_too_large` for a width or precision past the limit."""
    probe = Workflow(prompt_template=template)
    try:
        probe.render(dict.fromkeys(probe.variables(), ""))
    except TemplateLimit as exc:
        raise InvalidInput(exc.code, f"Invalid prompt template: {exc.message}", "prompt_template") from None
    except (KeyError, ValueError, IndexError, AttributeError, TypeError) as exc:
        message = exc.args[0] if exc.args else str(exc)
        raise InvalidInput(
            "invalid_template", f"Invalid prompt template: {message}", "prompt_template"
        ) from None
    return template


# ---------------------------------------------------------------- per-user caps (docs/security.md, "Limits")


def hold_owner(owner_id: Any) -> None:
    """Lock the user's row until the transaction ends (call inside atomic()).

    A cap's count and the insert it allows become one step: two creations at once queue here
    instead of both passing the same count. `FOR NO KEY UPDATE` leaves inserts that reference the
    user (which take KEY SHARE) free; SQLite's IMMEDIATE transactions serialise writers anyway.
    """
    users = get_user_model().objects.select_for_update(no_key=True).filter(pk=owner_id)
    list(users.values_list("pk", flat=True))


def refuse_past_project_cap(owner_id: Any) -> None:
    """Conflict `too_many_projects` when the user holds HERMESWEB_MAX_PROJECTS_PER_USER (after hold_owner)."""
    limit = settings.HERMESWEB_MAX_PROJECTS_PER_USER
    if Project.objects.filter(owner_id=owner_id).count() >= limit:
        raise Conflict(
            f"You have {limit} projects, the most one user may have; delete one first.", "too_many_projects"
        )


def hold_session_room(owner_id: Any, *, pending: int = 0) -> None:
    """Lock the user (hold_owner) and refuse with Conflict `too_many_sessions` when their sessions,
    plus `pending` ones already promised (imports asked for), reach HERMESWEB_MAX_SESSIONS_PER_USER.
    Call inside atomic(), before the session is created."""
    hold_owner(owner_id)
    limit = settings.HERMESWEB_MAX_SESSIONS_PER_USER
    if Session.objects.filter(project__owner_id=owner_id).count() + pending >= limit:
        raise Conflict(
            f"You have {limit} sessions, the most one user may have; delete some first.", "too_many_sessions"
        )


def _slug_base(name: str) -> str:
    # Room is left for a "-NNNN" suffix.
    return slugify(name)[: _SLUG_MAX - 8].strip("-") or "project"


def unique_slug(owner: Any, name: str) -> str:
    """The name's slug, or slug-2, slug-3 … whichever the owner has not used yet."""
    base = _slug_base(name)
    taken = set(Project.objects.filter(owner=owner, slug__startswith=base).values_list("slug", flat=True))
    if base not in taken:
        return base
    suffix = 2
    while f"{base}-{suffix}" in taken:
        suffix += 1
    return f"{base}-{suffix}"


# ---------------------------------------------------------------- projects


def do_create_project(
    owner: Any,
    *,
    name: str,
    path: str,
    agent: str | None = None,
    running_default: str = RunningDefault.QUEUE,
    required_labels: list[str] | None = None,
) -> Project:
    """Create a project owned by `owner` with a slug unique among the owner's projects.

    Preconditions: none; `path` must resolve to an existing directory strictly inside
    HERMESWEB_ALLOWED_ROOTS, clear of other users' projects (projects.paths), and `agent`
    must be configured (None → the default); Conflict `too_many_projects` past the owner's cap.
    A concurrent create that takes the same slug is retried with the next one.
    """
    fields = {
        "name": name,
        "path": clean_path(path, owner_id=owner.pk),
        "agent": clean_agent(agent),
        "running_default": clean_running_default(running_default),
        "required_labels": clean_labels(required_labels or []),
    }
    for _ in range(_SLUG_ATTEMPTS):
        try:
            with transaction.atomic():
                hold_owner(owner.pk)
                refuse_past_project_cap(owner.pk)
                return Project.objects.create(owner=owner, slug=unique_slug(owner, name), **fields)
        except IntegrityError:
            continue
    raise Conflict("Could not choose a unique slug for this project; try again.")


def do_update_project(
    project: Project,
    *,
    name: str | None = None,
    path: str | None = None,
    agent: str | None = None,
    running_default: str | None = None,
    status: str | None = None,
    required_labels: list[str] | None = None,
) -> Project:
    """Change the given fields; None leaves a field as it is. The slug stays stable.

    The new path and agent take effect for the next run; a run in progress
    keeps the working directory and agent process it started with. Archiving
    (`status`) refuses new messages to its sessions from then on (runs.services);
    a run in progress, and messages already queued, still finish.
    """
    if name is not None:
        project.name = name
    if path is not None:
        project.path = clean_path(path, owner_id=project.owner_id, project_id=project.pk)
    if agent is not None:
        project.agent = clean_agent(agent)
    if running_default is not None:
        project.running_default = clean_running_default(running_default)
    if status is not None:
        project.status = clean_status(status, ProjectStatus.values)
    if required_labels is not None:  # queued turns wait for a runner that offers them
        project.required_labels = clean_labels(required_labels)
    project.save()
    return project


def do_delete_project(project: Project) -> None:
    """Delete the project with its workflows, sessions, runs and journals.

    Refused with Conflict while any of its sessions has an active run: the
    runner holds that run's agent process and would write into a void.
    """
    from runs.models import Run

    with transaction.atomic():
        Project.objects.select_for_update().filter(pk=project.pk).first()
        if Run.objects.filter(session__project=project).active().exists():
            raise Conflict("A session of this project has an active run; cancel it first.")
        project.delete()


# ---------------------------------------------------------------- workflows


def do_create_workflow(
    project: Project,
    *,
    name: str,
    prompt_template: str,
    description: str = "",
    agent_mode: str = "",
    agent_model: str = "",
) -> Workflow:
    """Create a workflow; the template must render (see clean_template)."""
    return Workflow.objects.create(
        project=project,
        name=name,
        prompt_template=clean_template(prompt_template),
        description=description,
        agent_mode=agent_mode,
        agent_model=agent_model,
    )


def do_update_workflow(
    workflow: Workflow,
    *,
    name: str | None = None,
    prompt_template: str | None = None,
    description: str | None = None,
    agent_mode: str | None = None,
    agent_model: str | None = None,
) -> Workflow:
    """Change the given fields; None leaves a field as it is. Runs already launched keep their prompt."""
    if name is not None:
        workflow.name = name
    if prompt_template is not None:
        workflow.prompt_template = clean_template(prompt_template)
    if description is not None:
        workflow.description = description
    if agent_mode is not None:
        workflow.agent_mode = agent_mode
    if agent_model is not None:
        workflow.agent_model = agent_model
    workflow.save()
    return workflow


def do_delete_workflow(workflow: Workflow) -> None:
    """Delete the workflow; runs it launched stay (their source_meta names it)."""
    workflow.delete()


# ---------------------------------------------------------------- sessions


def do_create_session(project: Project, *, title: str = "") -> Session:
    """Create an empty, active session; the agent's sessionId is set by the runner on the first run.

    Refused (Conflict `project_archived`) in an archived project: nothing could be sent in it;
    Conflict `too_many_sessions` past the owner's cap.
    """
    from runs import notify

    refuse_if_archived(project)
    with transaction.atomic():
        hold_session_room(project.owner_id)
        session = Session.objects.create(project=project, title=title)
    # The owner's other tabs list it (runs.live.user_feed).
    notify.publish_on_commit(notify.publish_user_sessions_changed, project.owner_id)
    return session


def do_update_session(
    session: Session,
    *,
    title: str | None = None,
    status: str | None = None,
    mode: str | None = None,
    model: str | None = None,
    config: dict[str, Any] | None = None,
) -> Session:
    """Rename, archive or restore; choose the agent's mode or model for the next turns.

    An archived session refuses new messages; a run in progress finishes. `mode` must be one of
    the modes the agent reported for the session (InvalidInput `unknown_mode`, also while it has
    reported none); `model` is free (the agent refuses a model it cannot serve, on the turn);
    `config` is merged into the session's config choices (ConfigRefused `unknown_config_option` /
    `invalid_config_value`: projects/session_options.py).
    Either applies before the session's next turn (runs/runner/session_config.py), never to a
    turn already running; "" clears the choice. A change of status, title, mode or model reaches
    the session's open sockets (their composers lock or unlock, their pickers follow).
    """
    from runs import notify

    fields = []
    changed = status is not None and status != session.status
    if title is not None:
        session.title = title
        fields.append("title")
    if status is not None:
        session.status = clean_status(status, SessionStatus.values)
        fields.append("status")
    if mode is not None:
        session.mode = clean_mode(mode, session)
        fields.append("mode")
    if model is not None:
        session.model = clean_model(model)
        fields.append("model")
    with transaction.atomic():
        if config is not None:  # merged with the row's choices under its lock: two tabs' both count
            row = Session.objects.select_for_update().values("config", "config_options").get(pk=session.pk)
            session.config = clean_config(config, row["config_options"] or [], row["config"] or {})
            fields.append("config")
        # Only what changed: the runner writes the agent's modes, title and commands meanwhile.
        session.save(update_fields=[*fields, "updated_at"])
    if changed or fields:  # a title too: the owner's other tabs show it
        notify.publish_on_commit(notify.publish_session_changed, session.pk)
    return session


def clean_mode(mode: str, session: Session) -> str:
    """`mode` if the agent reported it for `session` (or "", no choice); else InvalidInput `unknown_mode`."""
    known = [m.get("id") for m in session.available_modes or [] if isinstance(m, dict)]
    if mode and mode not in known:
        offered = ", ".join(str(k) for k in known) if known else "none yet (they arrive with the first turn)"
        raise InvalidInput("unknown_mode", f"Unknown mode {mode!r}; the agent's modes: {offered}.", "mode")
    return mode


def clean_model(model: str) -> str:
    """A model id as typed: any printable text (the agent decides what it serves)."""
    if not model.isprintable():
        raise InvalidInput("invalid_model", "A model id cannot contain control characters.", "model")
    return model


def do_apply_workflow_settings(session: Session, workflow: Workflow) -> Session:
    """The workflow's `agent_mode`/`agent_model` (those it sets) become `session`'s, for the turn it launches.

    A mode the session's agent did not report is InvalidInput `unknown_mode`, checked only once
    the agent reported modes (a new session learns them on its first turn; a mode the agent
    refuses then fails that turn with `mode_refused`).
    """
    from runs import notify

    fields = []
    if workflow.agent_mode and workflow.agent_mode != session.mode:
        session.mode = (
            clean_mode(workflow.agent_mode, session) if session.available_modes else workflow.agent_mode
        )
        fields.append("mode")
    if workflow.agent_model and workflow.agent_model != session.model:
        session.model = workflow.agent_model
        fields.append("model")
    if fields:
        session.save(update_fields=[*fields, "updated_at"])
        notify.publish_on_commit(notify.publish_session_changed, session.pk)
    return session


def do_delete_session(session: Session) -> None:
    """Delete the session with its runs, journals and intents.

    Refused with Conflict while it has an active run. The session row is locked
    first so a message submitted concurrently (which locks it too) either lands
    before the check or finds the session gone.
    """
    from runs import notify
    from runs.models import Run

    with transaction.atomic():
        Session.objects.select_for_update().filter(pk=session.pk).first()
        if Run.objects.filter(session_id=session.pk).active().exists():
            raise Conflict("The session has an active run; cancel it first.")
        owner_id = session.project.owner_id
        session.delete()
        notify.publish_on_commit(notify.publish_user_sessions_changed, owner_id)
