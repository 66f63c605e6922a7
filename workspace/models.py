"""Checkpoints of a project's tree, taken by the runner at each run's ends and by each rewind.

Design note: docs/workspace.md. A row names a tree in the project's private object store
(workspace/store.py); the store holds the bytes, deduplicated across every checkpoint.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Q
from django.utils import timezone

from projects.models import Project, Session
from runs.models import Run


class CheckpointKind(models.TextChoices):
    START = "start"  # before the run's prompt reached the agent
    END = "end"  # before the run's terminal event
    REWIND = "rewind"  # the tree a rewind replaced (restoring it undoes the rewind)
    RESTORE = "restore"  # the tree a restore replaced


class CheckpointQuerySet(models.QuerySet["Checkpoint"]):
    def visible_to(self, user: Any) -> CheckpointQuerySet:
        return self.filter(session__project__owner=user)  # staff too, as ProjectQuerySet.visible_to

    def of_run(self, run_id: int, kind: str) -> Checkpoint | None:
        return self.filter(run_id=run_id, kind=kind).order_by("-pk").first()

    def latest_of_session(self, session_id: int) -> Checkpoint | None:
        return self.filter(session_id=session_id).order_by("-pk").first()

    def first_of_session(self, session_id: int) -> Checkpoint | None:
        return self.filter(session_id=session_id, kind=CheckpointKind.START).order_by("pk").first()


class Checkpoint(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="checkpoints", db_index=False)
    # Kept as long as their session: removed with it.
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="checkpoints", db_index=False)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="checkpoints", null=True, blank=True)
    kind = models.CharField(max_length=10, choices=CheckpointKind.choices)
    tree = models.CharField(max_length=64, help_text="The tree in the project's object store.")
    # A rewind's or restore's tree right after it: what its undo expects to find.
    result_tree = models.CharField(max_length=64, blank=True)
    # What a rewind or restore wrote back, and the checkpoint whose tree it restored.
    restored = models.JSONField(default=list, blank=True)
    restores = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    client_id = models.CharField(max_length=100, blank=True)
    stats = models.JSONField(default=dict, blank=True, help_text="files, bytes, not_checkpointed")
    created_at = models.DateTimeField(default=timezone.now)

    objects = CheckpointQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["session", "client_id"],
                condition=~Q(client_id=""),
                name="checkpoint_client_id_unique",
            )
        ]
        indexes = [models.Index(fields=["session", "kind"])]

    def __str__(self) -> str:
        return f"Checkpoint {self.pk} ({self.kind} of run {self.run_id})"

    @property
    def after_tree(self) -> str:
        """The project's tree once this checkpoint's action was done."""
        return self.result_tree or self.tree


class ProjectCheckpoints(models.Model):
    """Per project: whether checkpoints are off (a tree over the caps) and why, shown to its user."""

    project = models.OneToOneField(Project, on_delete=models.CASCADE, related_name="checkpoint_state")
    off_reason = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "project checkpoints"

    def __str__(self) -> str:
        return f"Checkpoints of {self.project_id}: {'off' if self.off_reason else 'on'}"


class GitCommit(models.Model):
    """A commit the files panel made in a project's own repository: its client_id answers again."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="git_commits", db_index=False)
    client_id = models.CharField(max_length=100)
    commit = models.CharField(max_length=64)
    branch = models.CharField(max_length=255, blank=True)
    paths = models.JSONField(default=list)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "client_id"], name="git_commit_client_id_unique")
        ]

    def __str__(self) -> str:
        return f"Commit {self.commit[:12]} in project {self.project_id}"
