from __future__ import annotations

from django.contrib import admin

from intents.models import PendingIntent


@admin.register(PendingIntent)
class PendingIntentAdmin(admin.ModelAdmin):
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
    search_fields = ["text", "client_id", "reason"]
    list_select_related = ["session"]
    raw_id_fields = ["session", "target_run", "run"]
    readonly_fields = ["created_at", "updated_at"]

    @admin.display(description="text")
    def short_text(self, obj: PendingIntent) -> str:
        return obj.text if len(obj.text) <= 80 else obj.text[:79] + "…"
