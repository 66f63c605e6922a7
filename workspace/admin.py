"""Checkpoints in the diagnostics console: counted per project, and checkpoints turned back on."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import Count, QuerySet
from django.http import HttpRequest

from hermesweb.admin import ReadOnlyMixin, StaffViewMixin
from workspace.models import Checkpoint, ProjectCheckpoints


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ["id", "project", "session", "run", "kind", "tree", "created_at"]
    # Counted per project (and kind) beside each filter choice.
    list_filter = ["kind", "project"]
    show_facets = admin.ShowFacets.ALWAYS
    list_select_related = ["project", "session"]
    raw_id_fields = ["project", "session", "run", "restores"]
    search_fields = ["tree", "client_id"]


@admin.register(ProjectCheckpoints)
class ProjectCheckpointsAdmin(StaffViewMixin, admin.ModelAdmin):
    """Per project: how many checkpoints it keeps and whether they are off (a tree over the caps)."""

    list_display = ["project", "checkpoints", "off", "updated_at"]
    readonly_fields = ["project", "off_reason", "updated_at"]
    actions = ["turn_on"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        return super().get_queryset(request).annotate(kept=Count("project__checkpoints"))

    @admin.display(description="checkpoints", ordering="kept")
    def checkpoints(self, obj: Any) -> int:
        return obj.kept

    @admin.display(boolean=True, description="off")
    def off(self, obj: ProjectCheckpoints) -> bool:
        return bool(obj.off_reason)

    @admin.action(description="Turn checkpoints back on (the tree was made smaller)", permissions=["change"])
    def turn_on(self, request: HttpRequest, queryset: QuerySet[ProjectCheckpoints]) -> None:
        count = queryset.update(off_reason="")
        self.message_user(request, f"Checkpoints on again for {count} project(s).", messages.SUCCESS)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
