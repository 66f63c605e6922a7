from __future__ import annotations

from django.contrib import admin

from projects.models import Project, Session, Workflow


class WorkflowInline(admin.TabularInline):
    model = Workflow
    extra = 0
    fields = ["name", "description", "agent_mode", "agent_model"]
    show_change_link = True


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "owner", "agent", "running_default", "path", "updated_at"]
    list_filter = ["agent", "running_default", "created_at"]
    search_fields = ["name", "slug", "path", "owner__username"]
    list_select_related = ["owner"]
    readonly_fields = ["created_at", "updated_at"]
    inlines = [WorkflowInline]


@admin.register(Workflow)
class WorkflowAdmin(admin.ModelAdmin):
    list_display = ["name", "project", "agent_mode", "agent_model", "updated_at"]
    list_filter = ["project"]
    search_fields = ["name", "description", "prompt_template", "project__name"]
    list_select_related = ["project"]
    readonly_fields = ["created_at", "updated_at"]


@admin.register(Session)
class SessionAdmin(admin.ModelAdmin):
    list_display = ["__str__", "project", "status", "agent_session_id", "model", "mode", "updated_at"]
    list_filter = ["status", "project"]
    search_fields = ["title", "agent_session_id", "project__name"]
    list_select_related = ["project"]
    readonly_fields = ["created_at", "updated_at"]
