"""Pending intents in the diagnostics console: read-only, because their edits carry a version check."""

from __future__ import annotations

from django.contrib import admin

from hermesweb.admin import ReadOnlyMixin
from intents.models import PendingIntent


@admin.register(PendingIntent)
class PendingIntentAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = [
        "id",
        "session",
        "kind",
        "state",
        "position",
        "version",
        "short_text",
        "source",
        "updated_at",
    ]
    list_filter = ["kind", "state", "source"]
    search_fields = ["text", "client_id", "reason", "=session__id"]
    list_select_related = ["session"]

    @admin.display(description="text")
    def short_text(self, obj: PendingIntent) -> str:
        return obj.text if len(obj.text) <= 80 else obj.text[:79] + "…"
