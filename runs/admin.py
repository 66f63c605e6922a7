"""The runs side of the diagnostics console (docs/operations.md).

Runs list with their lease and a stale flag; a run's page shows its
materialized transcript, its controls with their results and its journal,
paginated. Nothing here edits the journal: "mark interrupted" goes through
runs.turns.do_mark_interrupted, which journals the terminal event like a
reaper would.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import orjson
from django.conf import settings
from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.core.paginator import Paginator
from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timesince

from hermesweb.admin import ReadOnlyMixin
from runs import placement
from runs.export import item_markdown
from runs.markdown import render_markdown
from runs.models import AgentJob, Attachment, Control, JournalEvent, Run, Runner, RunStatus
from runs.transcript import materialize
from runs.turns import do_mark_interrupted

EVENTS_PER_PAGE = 100
# The run actions are offered in the runs list and on a run's own page.
BOTH = [admin.ActionLocation.CHANGE_LIST, admin.ActionLocation.CHANGE_FORM]
# A payload shown in the events table is cut here; the full one is in the JSONL export.
PAYLOAD_PREVIEW = 2000


def _ago(moment: datetime | None, now: datetime | None = None) -> str:
    if moment is None:
        return "—"
    now = now or timezone.now()
    if moment > now:
        return f"in {timesince(now, moment)}"
    return f"{timesince(moment, now)} ago"


def _runner_is_alive(runner: Runner, now: datetime | None = None) -> bool:
    # The same rule as RunnerQuerySet.alive(), without a query per row.
    horizon = (now or timezone.now()) - timedelta(seconds=settings.HERMESWEB_LEASE_SECONDS)
    return runner.stopped_at is None and runner.heartbeat_at >= horizon


def _pretty(value: Any, limit: int | None = None) -> str:
    text = json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True)
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


# ---------------------------------------------------------------- runs


class ConditionFilter(admin.SimpleListFilter):
    """What an operator looks for first: runs stuck with a dead runner, and runs that ended badly."""

    title = "condition"
    parameter_name = "condition"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [
            ("stale", "Stale (executing, lease expired)"),
            ("interrupted", "Interrupted"),
            ("failed", "Failed"),
            ("active", "Active"),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Run]) -> QuerySet[Run]:
        value = self.value()
        if value == "stale":
            return queryset.stale()  # type: ignore[attr-defined]
        if value == "interrupted":
            return queryset.filter(status=RunStatus.INTERRUPTED)
        if value == "failed":
            return queryset.filter(status=RunStatus.FAILED)
        if value == "active":
            return queryset.active()  # type: ignore[attr-defined]
        return queryset


class ControlInline(ReadOnlyMixin, admin.TabularInline):
    model = Control
    extra = 0
    can_delete = False
    verbose_name_plural = "controls and their results"
    fields = ["kind", "target_id", "state", "result", "message", "event_seq", "created_at", "applied_at"]
    readonly_fields = fields


@admin.register(Run)
class RunAdmin(ReadOnlyMixin, admin.ModelAdmin):
    change_form_template = "admin/runs/run/change_form.html"
    list_display = [
        "id",
        "session",
        "status",
        "stale",
        "age",
        "lease_holder",
        "source",
        "last_seq",
        "created_at",
        "finished_at",
    ]
    list_filter = [ConditionFilter, "status", "source", "created_at"]
    search_fields = ["=id", "prompt_text", "client_id", "lease_owner", "session__title"]
    list_select_related = ["session"]
    ordering = ["-created_at", "-id"]
    actions = ["mark_interrupted", "export_journal"]
    fieldsets = [
        (None, {"fields": ["session", "status", "stale", "source", "source_meta", "client_id"]}),
        ("Prompt", {"fields": ["prompt_text", "attachments"]}),
        ("Lease", {"fields": ["lease_owner", "lease_expires_at", "lease_holder", "runner_state"]}),
        (
            "Outcome",
            {
                "fields": [
                    "stop_reason",
                    "error",
                    "usage",
                    "last_seq",
                    "compacted_through",
                    "created_at",
                    "started_at",
                    "finished_at",
                ]
            },
        ),
    ]
    readonly_fields = ["stale", "age", "lease_holder", "runner_state"]
    inlines = [ControlInline]

    def has_delete_permission(self, request: HttpRequest, obj: Run | None = None) -> bool:
        # An active run belongs to a runner; deleting it would orphan its turn.
        return super().has_delete_permission(request, obj) and (obj is None or not obj.is_active)

    def get_actions(
        self, request: HttpRequest, action_location: admin.ActionLocation = admin.ActionLocation.CHANGE_LIST
    ) -> dict[str, Any]:
        actions = super().get_actions(request, action_location=action_location)
        # Bulk delete would take active runs too; delete finished runs one at a time.
        actions.pop("delete_selected", None)
        return actions

    @admin.display(boolean=True, description="stale")
    def stale(self, obj: Run) -> bool:
        return obj.lease_is_stale()

    @admin.display(description="age", ordering="created_at")
    def age(self, obj: Run) -> str:
        return timesince(obj.created_at, timezone.now())

    @admin.display(description="lease holder", ordering="lease_owner")
    def lease_holder(self, obj: Run) -> str:
        if not obj.lease_owner:
            return "—"
        if obj.lease_expires_at is None:
            return obj.lease_owner
        now = timezone.now()
        verb = "expires" if obj.lease_expires_at >= now else "expired"
        return f"{obj.lease_owner} ({verb} {_ago(obj.lease_expires_at, now)})"

    @admin.display(description="lease holder's runner")
    def runner_state(self, obj: Run) -> str:
        if not obj.lease_owner:
            return "—"
        runner = Runner.objects.filter(pk=obj.lease_owner).first()
        if runner is None:
            return "unknown runner"
        alive = "alive" if _runner_is_alive(runner) else "not alive"
        return f"{alive}: {runner.host} pid {runner.pid}, last heartbeat {_ago(runner.heartbeat_at)}"

    # ------------------------------------------------------------ actions

    # Viewing the console needs only staff (StaffViewMixin); an action needs a model permission,
    # checked by Django as it lists and as it runs the actions (superusers hold every one).
    def has_mark_interrupted_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("runs.change_run")

    def has_export_journal_permission(self, request: HttpRequest) -> bool:
        # As Django's own admin, change implies view.
        return request.user.has_perm("runs.view_run") or request.user.has_perm("runs.change_run")

    @admin.action(
        description="Mark interrupted (journals error + done)",
        location=BOTH,
        permissions=["mark_interrupted"],
    )
    def mark_interrupted(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        alive = set(Runner.objects.alive().values_list("pk", flat=True))
        reason = f"marked interrupted by {request.user.get_username()} from the admin"
        marked, finished, held = 0, 0, 0
        for run in queryset.order_by("pk"):
            if run.is_terminal:
                finished += 1
                continue
            live = run.lease_owner in alive and not run.lease_is_stale()
            if do_mark_interrupted(run, reason, code="operator_interrupted"):
                marked += 1
                held += live
            else:
                finished += 1  # it ended while we looked
        parts = [f"Marked {marked} run(s) interrupted."]
        if finished:
            parts.append(f"{finished} had already finished and were left unchanged.")
        if held:
            parts.append(
                f"{held} were held by a live runner, which stops their turns at its next lease renewal."
            )
        self.message_user(request, " ".join(parts))

    @admin.action(
        description="Export journal (JSONL envelopes)", location=BOTH, permissions=["export_journal"]
    )
    def export_journal(self, request: HttpRequest, queryset: QuerySet[Run]) -> HttpResponse:
        sessions = dict(queryset.order_by("pk").values_list("pk", "session_id"))
        events = JournalEvent.objects.filter(run_id__in=sessions).order_by("run_id", "seq")
        body = b"".join(
            orjson.dumps(event.envelope(sessions[event.run_id]), option=orjson.OPT_NON_STR_KEYS) + b"\n"
            for event in events.iterator(chunk_size=2000)
        )
        response = HttpResponse(body, content_type="application/x-ndjson")
        stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
        response["Content-Disposition"] = f'attachment; filename="journal-{stamp}.jsonl"'
        return response

    # ------------------------------------------------------------ the run's page

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict | None = None
    ) -> HttpResponse:
        context = dict(extra_context or {})
        run = self.get_object(request, unquote(object_id))
        if run is not None:
            context.update(self._diagnostics(request, run))
        return super().change_view(request, object_id, form_url, context)

    def _diagnostics(self, request: HttpRequest, run: Run) -> dict[str, Any]:
        events = JournalEvent.objects.filter(run=run).order_by("seq")
        page = Paginator(events, EVENTS_PER_PAGE).get_page(request.GET.get("events_page"))
        rows = [
            {
                "seq": event.seq,
                "type": event.type,
                "created_at": event.created_at,
                "terminal": event.terminal,
                "payload": _pretty(event.payload, PAYLOAD_PREVIEW),
            }
            for event in page.object_list
        ]
        state = materialize(events)
        # render_markdown sanitizes (markdown-it without raw HTML, then nh3): safe to mark so.
        items = []
        for item in state["items"]:
            rendered = item_markdown(item)
            if rendered:
                items.append({"kind": item["kind"], "html": mark_safe(render_markdown(rendered))})
        usage = state["usage_final"] or state["usage"]
        return {
            "events_page": page,
            "event_rows": rows,
            "transcript": {
                "prompt_html": mark_safe(render_markdown(run.prompt_text)),
                "items": items,
                "state": state["terminal_state"] or state["status"],
                "reason": state.get("terminal_reason") or state.get("stop_reason") or "",
                "usage": _pretty(usage) if usage else "",
                "compacted_through": run.compacted_through,
            },
        }


@admin.register(JournalEvent)
class JournalEventAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ["__str__", "run", "seq", "type", "terminal", "created_at"]
    list_filter = ["type", "terminal"]
    search_fields = ["=run__id"]
    list_select_related = ["run"]
    fields = ["run", "seq", "type", "terminal", "created_at", "payload_pretty"]
    readonly_fields = ["payload_pretty"]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # append-only: compaction (manage.py compact_journal) is the only rewrite

    @admin.display(description="payload")
    def payload_pretty(self, obj: JournalEvent) -> SafeString:
        return format_html("<pre>{}</pre>", _pretty(obj.payload))


@admin.register(Control)
class ControlAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ["id", "run", "kind", "target_id", "state", "result", "created_at", "applied_at"]
    list_filter = ["kind", "state", "result"]
    search_fields = ["key", "target_id", "message", "=run__id"]
    list_select_related = ["run"]


# ---------------------------------------------------------------- runners


class AliveFilter(admin.SimpleListFilter):
    title = "alive"
    parameter_name = "alive"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Alive"), ("no", "Not alive")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Runner]) -> QuerySet[Runner]:
        alive = Runner.objects.alive().values("pk")
        if self.value() == "yes":
            return queryset.filter(pk__in=alive)
        if self.value() == "no":
            return queryset.exclude(pk__in=alive)
        return queryset


@admin.register(Runner)
class RunnerAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = [
        "id",
        "host",
        "pid",
        "is_alive",
        "heartbeat",
        "held_runs",
        "labels",
        "serves",
        "stopped_at",
    ]
    list_filter = [AliveFilter, "host"]
    search_fields = ["id", "host"]
    fields = [
        "id",
        "host",
        "pid",
        "is_alive",
        "started_at",
        "heartbeat",
        "stopped_at",
        "held_runs",
        "labels",
        "roots",
        "serves",
        "capabilities",
    ]
    readonly_fields = ["is_alive", "heartbeat", "held_runs", "serves", "capabilities"]

    @admin.display(description="can serve")
    def serves(self, obj: Runner) -> str:
        """The projects whose turns this runner may take (runs.placement): its labels and roots."""
        return placement.served_projects_text(obj)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Runner]:
        held = (
            Run.objects.executing()
            .filter(lease_owner=OuterRef("pk"))
            .order_by()
            .values("lease_owner")
            .annotate(n=Count("pk"))
            .values("n")
        )
        return (
            super()
            .get_queryset(request)
            .annotate(held_count=Coalesce(Subquery(held, output_field=IntegerField()), 0))
        )

    @admin.display(boolean=True, description="alive")
    def is_alive(self, obj: Runner) -> bool:
        return _runner_is_alive(obj)

    @admin.display(description="last heartbeat", ordering="heartbeat_at")
    def heartbeat(self, obj: Runner) -> str:
        return f"{obj.heartbeat_at:%Y-%m-%d %H:%M:%S} ({_ago(obj.heartbeat_at)})"

    @admin.display(description="runs held", ordering="held_count")
    def held_runs(self, obj: Runner) -> SafeString | int:
        count = getattr(obj, "held_count", 0)
        if not count:
            return 0
        url = reverse("admin:runs_run_changelist") + f"?lease_owner={obj.pk}"
        return format_html('<a href="{}">{}</a>', url, count)

    @admin.display(description="agent capabilities (initialize)")
    def capabilities(self, obj: Runner) -> SafeString:
        return format_html("<pre>{}</pre>", _pretty(obj.agent_capabilities))


# ---------------------------------------------------------------- agent jobs


@admin.register(AgentJob)
class AgentJobAdmin(ReadOnlyMixin, admin.ModelAdmin):
    list_display = ["id", "project", "kind", "state", "runner_id", "error_code", "created_at", "finished_at"]
    list_filter = ["kind", "state"]
    search_fields = ["=id", "project__name", "runner_id", "error"]
    list_select_related = ["project"]
    ordering = ["-created_at", "-id"]


# ---------------------------------------------------------------- attachments


@admin.register(Attachment)
class AttachmentAdmin(ReadOnlyMixin, admin.ModelAdmin):
    """What was uploaded, never the bytes: the file is its owner's (docs/security.md, "Attachments")."""

    list_display = ["id", "name", "mime_type", "size", "session", "created_at"]
    list_filter = ["mime_type"]
    search_fields = ["=id", "name", "=sha256", "session__title"]
    list_select_related = ["session"]
    ordering = ["-created_at", "-id"]
    fields = ["session", "name", "mime_type", "size", "sha256", "path", "created_at"]
