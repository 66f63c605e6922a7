"""Project, Workflow, Session — the three product objects (docs/domain.md)."""

from __future__ import annotations

import string
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from projects.prompts import render_template

if TYPE_CHECKING:
    from runs.models import Run


class RunningDefault(models.TextChoices):
    QUEUE = "queue", "Queue by default"
    STEER = "steer", "Steer by default"


class ProjectStatus(models.TextChoices):
    ACTIVE = "active", "Active"
    ARCHIVED = "archived", "Archived"


class ProjectQuerySet(models.QuerySet["Project"]):
    def visible_to(self, user: Any) -> ProjectQuerySet:
        # The user's own, staff and superusers included: staff act on others' objects only
        # through the admin, with its model permissions (docs/security.md, "Staff").
        return self.filter(owner=user)

    def active(self) -> ProjectQuerySet:
        return self.filter(status=ProjectStatus.ACTIVE)


class Project(models.Model):
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=200)
    path = models.CharField(max_length=4096, help_text="Absolute, resolved working directory.")
    agent = models.CharField(max_length=100, help_text="Name of an operator-configured agent.")
    running_default = models.CharField(
        max_length=10, choices=RunningDefault.choices, default=RunningDefault.QUEUE
    )
    # Archived: out of the default lists, and its sessions take no new messages (runs.services).
    status = models.CharField(max_length=20, choices=ProjectStatus.choices, default=ProjectStatus.ACTIVE)
    # Labels a runner must offer to run its turns (runs.placement), e.g. ["host=build-1"].
    required_labels = models.JSONField(default=list, blank=True)
    # No index of its own: the unique (owner, slug) leads with it.
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="projects", db_index=False
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ProjectQuerySet.as_manager()

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "slug"], name="project_slug_unique_per_owner")
        ]

    def __str__(self) -> str:
        return self.name


class WorkflowQuerySet(models.QuerySet["Workflow"]):
    def visible_to(self, user: Any) -> WorkflowQuerySet:
        return self.filter(project__owner=user)  # staff too, as ProjectQuerySet.visible_to


class Workflow(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="workflows")
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    prompt_template = models.TextField(help_text="Text with {variables}; {{ and }} for literal braces.")
    agent_mode = models.CharField(max_length=100, blank=True)
    agent_model = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    objects = WorkflowQuerySet.as_manager()

    class Meta:
        ordering = ["name", "id"]

    def __str__(self) -> str:
        return self.name

    def variables(self) -> list[str]:
        """The `{names}` the template expects, in order of first use."""
        names: list[str] = []
        for _, field_name, _, _ in string.Formatter().parse(self.prompt_template):
            if field_name is not None and field_name not in names:
                names.append(field_name)
        return names

    def render(self, variables: dict[str, str]) -> str:
        """Substitute variables; raise KeyError naming missing ones, ValueError for a bad template
        (projects.prompts.TemplateLimit, a ValueError, past a size limit)."""
        return render_template(self.prompt_template, variables)


class SessionStatus(models.TextChoices):
    ACTIVE = "active", "Active"
    ARCHIVED = "archived", "Archived"


# Whose a session is, as a Session lookup: visible_to filters on it, and the submit's
# one-statement path (runs.services) turns the same lookup into SQL.
SESSION_OWNER = "project__owner"


class SessionQuerySet(models.QuerySet["Session"]):
    def visible_to(self, user: Any) -> SessionQuerySet:
        return self.filter(**{SESSION_OWNER: user})  # staff too, as ProjectQuerySet.visible_to

    def lock(self, session_id: int, *, visible_to: Any | None = None) -> Session:
        """Serialise every decision about one session's turns. Call inside atomic().

        The lock order everywhere is session, then run. With `visible_to`, a session that
        user may not see is Session.DoesNotExist, checked by the same read. Only the
        session's row is locked, not its project's.
        """
        sessions = self if visible_to is None else self.visible_to(visible_to)
        return sessions.select_for_update(of=("self",)).select_related("project").get(pk=session_id)


class Session(models.Model):
    # No index of its own: (project, -updated_at) leads with it, and every turn touches updated_at.
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="sessions", db_index=False)
    title = models.CharField(max_length=300, blank=True)
    agent_session_id = models.CharField(
        max_length=200, blank=True, help_text="The ACP sessionId; empty until the agent created it."
    )
    status = models.CharField(max_length=20, choices=SessionStatus.choices, default=SessionStatus.ACTIVE)
    model = models.CharField(max_length=200, blank=True)
    mode = models.CharField(max_length=100, blank=True)
    commands = models.JSONField(default=list, blank=True, help_text="The agent's advertised slash commands.")
    # As the agent last reported them (session/new, session/load, current_mode_update); the API
    # calls them `modes` and `models` (a field named `models` would shadow django.db.models here).
    available_modes = models.JSONField(
        default=list, blank=True, help_text="Modes the agent reported: [{id, name, description}]."
    )
    available_models = models.JSONField(
        default=list, blank=True, help_text="Models the agent reported: [{id, name}]."
    )
    # The agent's `configOptions` as last reported (projects/session_options.py's shape), and the
    # user's choices among them {option id: value}, applied before each turn (issue 44).
    config_options = models.JSONField(default=list, blank=True, help_text="The agent's config options.")
    config = models.JSONField(default=dict, blank=True, help_text="Chosen config values by option id.")
    forked_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="forks", db_index=False
    )
    fork_agent_session_id = models.CharField(
        max_length=200,
        blank=True,
        help_text="The parent's ACP sessionId to fork (session/fork) when this session first runs.",
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    objects = SessionQuerySet.as_manager()

    class Meta:
        ordering = ["-updated_at", "-id"]
        indexes = [models.Index(fields=["project", "-updated_at"])]

    def __str__(self) -> str:
        return self.title or f"Session {self.pk}"

    def active_run(self) -> Run | None:
        return self.runs.active().first()  # type: ignore[attr-defined]
