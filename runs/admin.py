"""Admin for runs: a run shows its journal inline, read-only (the journal is append-only)."""

from __future__ import annotations

import json
from datetime import timedelta

from django.conf import settings
from django.contrib import admin
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html

from runs.models import Control, JournalEvent, Run, Runner


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class JournalEventInline(ReadOnlyInline):
    model = JournalEvent
    fields = ["seq", "type", "created_at", "terminal", "payload_json"]
    readonly_fields = fields
    ordering = ["seq"]

    @admin.display(description="payload")
    def payload_json(self, obj: JournalEvent) -> str:
        text = json.dumps(obj.payload, ensure_ascii=False)
        return format_html("<code>{}</code>", text if len(text) <= 400 else text[:399] + "…")


class ControlInline(ReadOnlyInline):
    model = Control
    fields = ["kind", "target_id", "key", "state", "result", "message", "created_at", "applied_at"]
    readonly_fields = fields


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "session",
        "status",
        "source",
        "last_seq",
        "lease_owner",
        "created_at",
        "finished_at",
    ]
    list_filter = ["status", "source", "created_at"]
    search_fields = ["prompt_text", "client_id", "lease_owner", "session__title"]
    list_select_related = ["session"]
    raw_id_fields = ["session"]
    readonly_fields = ["last_seq", "compacted_through", "created_at", "started_at", "finished_at"]
    inlines = [ControlInline, JournalEventInline]


@admin.register(JournalEvent)
class JournalEventAdmin(admin.ModelAdmin):
    list_display = ["__str__", "run", "seq", "type", "terminal", "created_at"]
    list_filter = ["type", "terminal"]
    search_fields = ["run__id"]
    raw_id_fields = ["run"]

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(Control)
class ControlAdmin(admin.ModelAdmin):
    list_display = ["id", "run", "kind", "target_id", "state", "result", "created_at", "applied_at"]
    list_filter = ["kind", "state", "result"]
    search_fields = ["key", "target_id", "message"]
    raw_id_fields = ["run"]


@admin.register(Runner)
class RunnerAdmin(admin.ModelAdmin):
    list_display = ["id", "host", "pid", "started_at", "heartbeat_at", "stopped_at", "is_alive"]
    list_filter = ["host"]
    search_fields = ["id", "host"]
    readonly_fields = ["started_at", "heartbeat_at"]

    @admin.display(boolean=True, description="alive")
    def is_alive(self, obj: Runner) -> bool:
        # The same rule as RunnerQuerySet.alive(), without a query per row.
        horizon = timezone.now() - timedelta(seconds=settings.HERMESWEB_LEASE_SECONDS)
        return obj.stopped_at is None and obj.heartbeat_at >= horizon
