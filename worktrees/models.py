"""A session's own git worktree: the intent the web records, the tree the runner makes.

Design note: docs/worktrees.md. The row is written with the session (persist before
dispatch); the runner creates the directory before the session's first turn and marks it
ready; a merge or a discard is recorded here, a merge by its client id (idempotent).
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from projects.models import Session


class WorktreeState(models.TextChoices):
    PENDING = "pending"  # asked for; the runner makes it before the first turn
    READY = "ready"
    ARCHIVED = "archived"  # removed with its session's archiving; remade from the branch on restore
    DISCARDED = "discarded"  # removed by the user: the session's turns fail, never run elsewhere


class Worktree(models.Model):
    session = models.OneToOneField(Session, on_delete=models.CASCADE, related_name="worktree")
    branch = models.CharField(max_length=200)
    base = models.CharField(max_length=200, help_text="The branch it merges back into.")
    base_commit = models.CharField(max_length=64, help_text="The commit the branch started from.")
    path = models.CharField(max_length=1000, help_text="Where the worktree lives (outside every root).")
    repository = models.CharField(max_length=1000, help_text="The main checkout, as it was when asked.")
    state = models.CharField(max_length=20, choices=WorktreeState.choices, default=WorktreeState.PENDING)
    error = models.TextField(blank=True, help_text="Why the runner could not make or use it, last time.")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.branch} (session {self.session_id})"


class MergeStrategy(models.TextChoices):
    MERGE = "merge"
    SQUASH = "squash"
    REBASE = "rebase"


class WorktreeMerge(models.Model):
    """A merge asked for by `client_id`: the same id again answers the same result."""

    worktree = models.ForeignKey(Worktree, on_delete=models.CASCADE, related_name="merges")
    client_id = models.CharField(max_length=100)
    strategy = models.CharField(max_length=10, choices=MergeStrategy.choices)
    commit = models.CharField(max_length=64)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["worktree", "client_id"], name="worktree_merge_client_id_unique")
        ]
