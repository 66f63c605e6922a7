"""Model signals of projects: a session that gets another owner — its project changes hands, or it
is moved to another project (both in the admin) — drops every process's owner cache (runs.notify)."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models.signals import post_save, pre_save
from django.dispatch import receiver

from projects.models import Project, Session
from runs import notify


def changes(instance: models.Model, field: str, update_fields: Any) -> bool:
    """Whether saving `instance` gives its foreign key `field` another value (one query, when it may)."""
    if instance.pk is None or (update_fields is not None and field not in update_fields):
        return False
    attname = f"{field}_id"
    before = type(instance).objects.filter(pk=instance.pk).values_list(attname, flat=True).first()
    return before is not None and before != getattr(instance, attname)


@receiver(pre_save, sender=Project, dispatch_uid="projects.owner_change_seen")
def owner_change_seen(sender: type[Project], instance: Project, update_fields: Any = None, **_: Any) -> None:
    instance.owners_changing = changes(instance, "owner", update_fields)


@receiver(pre_save, sender=Session, dispatch_uid="projects.session_move_seen")
def session_move_seen(sender: type[Session], instance: Session, update_fields: Any = None, **_: Any) -> None:
    instance.owners_changing = changes(instance, "project", update_fields)


@receiver(post_save, sender=Project, dispatch_uid="projects.owner_change_rung")
@receiver(post_save, sender=Session, dispatch_uid="projects.session_move_rung")
def owners_changed(sender: type[models.Model], instance: models.Model, **_: Any) -> None:
    """After commit: its sessions' doorbells ring the new owner, in every process."""
    if getattr(instance, "owners_changing", False):
        instance.owners_changing = False
        notify.publish_on_commit(notify.forget_owners)
