"""Triggers and firings in the diagnostics console: the system writes firings, staff only read them."""

from __future__ import annotations

from django.contrib import admin

from automations.models import Firing, Trigger
from hermesweb.admin import ReadOnlyMixin, StaffViewMixin


class FiringInline(admin.TabularInline):
    model = Firing
    extra = 0
    max_num = 0
    can_delete = False
    fields = ["planned_at", "fired_at", "outcome", "reason", "session", "run", "fired_by"]
    readonly_fields = fields
    ordering = ["-planned_at"]
    show_change_link = True


@admin.register(Trigger)
class TriggerAdmin(StaffViewMixin, admin.ModelAdmin):
    list_display = ["id", "workflow", "kind", "enabled", "cron", "timezone", "at", "next_fire_at"]
    list_filter = ["kind", "enabled", "missed", "overlap"]
    list_select_related = ["workflow"]
    raw_id_fields = ["workflow", "session"]
    # The secret's hash says nothing useful and is never edited by hand (rotate through the API).
    exclude = ["secret_digest"]
    readonly_fields = ["next_fire_at", "created_at", "updated_at"]
    inlines = [FiringInline]


@admin.register(Firing)
class FiringAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ["id", "trigger", "planned_at", "fired_at", "outcome", "session", "run", "fired_by"]
    list_filter = ["outcome"]
    list_select_related = ["trigger__workflow"]
    date_hierarchy = "planned_at"
    raw_id_fields = ["trigger", "session", "run", "intent"]
