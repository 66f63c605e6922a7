"""Projects, workflows and sessions in the diagnostics console: a session shows its runs and intents."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import Count, OuterRef, QuerySet, Subquery
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from hermesweb.admin import ReadOnlyMixin, StaffViewMixin
from intents.models import PendingIntent
from projects.models import Project, Session, Workflow
from projects.paths import PathRefused, validate_project_location, validate_project_path
from projects.services import InvalidInput, clean_template
from runs.models import Run


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class WorkflowInline(admin.TabularInline):
    model = Workflow
    extra = 0
    fields = ["name", "description", "agent_mode", "agent_model"]
    show_change_link = True


class ProjectAdminForm(forms.ModelForm):
    """The API's path rules in the admin too: a staff typo must not make a root a project."""

    class Meta:
        model = Project
        fields = "__all__"  # the ModelAdmin chooses which of them it shows

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        raw, owner = cleaned.get("path"), cleaned.get("owner")
        if raw:
            try:
                if owner is None:  # the owner field has its own error; check what needs no owner
                    resolved = validate_project_path(raw)
                else:
                    resolved = validate_project_location(raw, owner_id=owner.pk, project_id=self.instance.pk)
            except PathRefused as exc:
                self.add_error("path", forms.ValidationError(exc.message, code=exc.code))
            else:
                cleaned["path"] = str(resolved)
        return cleaned


@admin.register(Project)
class ProjectAdmin(StaffViewMixin, admin.ModelAdmin):
    form = ProjectAdminForm
    list_display = ["name", "slug", "owner", "agent", "running_default", "path", "updated_at"]
    list_filter = ["agent", "running_default", "created_at"]
    search_fields = ["name", "slug", "path", "owner__username"]
    list_select_related = ["owner"]
    readonly_fields = ["created_at", "updated_at"]
    inlines = [WorkflowInline]


class WorkflowAdminForm(forms.ModelForm):
    """The API's template rules in the admin too: a saved template is rendered at every launch."""

    class Meta:
        model = Workflow
        fields = "__all__"  # the ModelAdmin chooses which of them it shows

    def clean_prompt_template(self) -> str:
        try:
            return clean_template(self.cleaned_data["prompt_template"])
        except InvalidInput as exc:
            raise forms.ValidationError(exc.message, code=exc.code) from None


@admin.register(Workflow)
class WorkflowAdmin(StaffViewMixin, admin.ModelAdmin):
    form = WorkflowAdminForm
    list_display = ["name", "project", "agent_mode", "agent_model", "updated_at"]
    list_filter = ["project"]
    search_fields = ["name", "description", "prompt_template", "project__name"]
    list_select_related = ["project"]
    readonly_fields = ["created_at", "updated_at"]


class RunInline(ReadOnlyMixin, admin.TabularInline):
    """The session's turns, oldest first; each links to its run page (transcript, journal, controls)."""

    model = Run
    extra = 0
    can_delete = False
    show_change_link = True
    fields = ["status", "source", "prompt", "last_seq", "lease_owner", "created_at", "finished_at"]
    readonly_fields = fields
    ordering = ["created_at", "id"]

    @admin.display(description="prompt")
    def prompt(self, obj: Run) -> str:
        return _short(obj.prompt_text)


class PendingIntentInline(ReadOnlyMixin, admin.TabularInline):
    model = PendingIntent
    fk_name = "session"
    extra = 0
    can_delete = False
    show_change_link = True
    fields = [
        "kind",
        "state",
        "position",
        "version",
        "intent_text",
        "target_run",
        "run",
        "reason",
        "updated_at",
    ]
    readonly_fields = fields

    @admin.display(description="text")
    def intent_text(self, obj: PendingIntent) -> str:
        return _short(obj.text)


@admin.register(Session)
class SessionAdmin(StaffViewMixin, admin.ModelAdmin):
    list_display = [
        "__str__",
        "project",
        "status",
        "run_count",
        "active_run",
        "agent_session_id",
        "updated_at",
    ]
    list_filter = ["status", "project"]
    search_fields = ["title", "agent_session_id", "project__name", "=id"]
    list_select_related = ["project"]
    readonly_fields = ["created_at", "updated_at", "active_run"]
    raw_id_fields = ["project"]
    inlines = [RunInline, PendingIntentInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Session]:
        active = Run.objects.filter(session=OuterRef("pk")).active().values("pk")[:1]
        return (
            super().get_queryset(request).annotate(runs_total=Count("runs"), active_run_id=Subquery(active))
        )

    @admin.display(description="runs", ordering="runs_total")
    def run_count(self, obj: Session) -> int:
        return getattr(obj, "runs_total", 0)

    @admin.display(description="active run")
    def active_run(self, obj: Session) -> SafeString | str:
        run_id: Any = getattr(obj, "active_run_id", None)
        if run_id is None:
            run = obj.active_run() if obj.pk else None
            run_id = run.pk if run else None
        if run_id is None:
            return "—"
        return format_html('<a href="{}">run {}</a>', reverse("admin:runs_run_change", args=[run_id]), run_id)
