"""A deleted project's checkpoint store goes with it, once the deletion has committed."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models.signals import post_delete
from django.dispatch import receiver

from projects.models import Project
from workspace.store import Store


@receiver(post_delete, sender=Project, dispatch_uid="workspace.store_removed")
def store_removed(sender: type[Project], instance: Project, **_: Any) -> None:
    # After commit: a rolled-back deletion keeps its project's checkpoints restorable.
    store = Store(instance.pk, instance.path)
    transaction.on_commit(store.remove)
