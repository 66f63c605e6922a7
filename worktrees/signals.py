"""A session archived or deleted takes its worktree's directory with it; its branch stays.

Archiving marks the worktree `archived` (a restored session's next turn remakes it from the
branch); the git work happens after the commit, so a rolled-back change removes nothing.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from projects.models import Session, SessionStatus
from worktrees.models import Worktree, WorktreeState
from worktrees.services import remove_tree

log = logging.getLogger(__name__)


def _remove_later(row: Worktree) -> None:
    def remove() -> None:
        try:
            remove_tree(row)
        except Exception:  # a leftover directory is logged, never a failed archive or delete
            log.exception("could not remove the worktree at %s", row.path)

    transaction.on_commit(remove)


@receiver(post_save, sender=Session, dispatch_uid="worktrees.session_archived")
def session_archived(sender: Any, instance: Session, **kwargs: Any) -> None:
    if instance.status != SessionStatus.ARCHIVED:
        return
    live = (WorktreeState.PENDING, WorktreeState.READY)
    row = Worktree.objects.filter(session_id=instance.pk, state__in=live).first()
    if row is None:
        return
    Worktree.objects.filter(pk=row.pk).update(state=WorktreeState.ARCHIVED)
    _remove_later(row)


@receiver(post_delete, sender=Worktree, dispatch_uid="worktrees.worktree_deleted")
def worktree_deleted(sender: Any, instance: Worktree, **kwargs: Any) -> None:
    if instance.state in (WorktreeState.PENDING, WorktreeState.READY):
        _remove_later(instance)
