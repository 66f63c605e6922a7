"""The browser pages: sign-in, the workbench, and rendered markdown of settled turns.

Thin on purpose: the workbench is one template whose ES modules talk to the
JSON API (/api/) and the session socket (/ws/sessions/{id}/); the views only
embed the first screenful of data and render markdown (docs/ui.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_GET

from hermesweb.errors import MAX_ID
from hermesweb.preload import module_closure
from hermesweb.static_assets import import_map, page_modules
from projects.api import with_active_run
from projects.models import Project, Session
from projects.schemas import ProjectOut, SessionOut, WorkflowOut
from runs.markdown import render_markdown
from runs.models import TERMINAL_STATUSES, JournalEvent, Run
from runs.transcript import materialize
from runs.transcript_pages import PAGE_TURNS, PAGE_TURNS_MAX, PagedTurn, newest_turns, page_turns


def content_security_policy(*scripts: str) -> str:
    """The pages' CSP; `scripts`: the one inline script allowed by its hash (the import map).

    The workbench needs nothing from anywhere else; any other inline script is refused even if
    a sanitizer ever let some through. `connect-src 'self'` covers the same-origin WebSocket in
    CSP Level 3 browsers.
    """
    return "; ".join(
        [
            "default-src 'self'",
            " ".join(["script-src 'self'", *scripts]),
            "style-src 'self'",
            "img-src 'self' data:",
            "connect-src 'self'",
            "object-src 'none'",
            "base-uri 'none'",
            "frame-ancestors 'none'",
            "form-action 'self'",
        ]
    )


CONTENT_SECURITY_POLICY = content_security_policy()
SIDEBAR_SESSIONS = 200
# The workbench page's entry modules (templates/workbench.html): their imports are preloaded.
ENTRY_MODULES = ("js/main.js", "js/fork.js", "js/files.js", "js/worktree.js")
FRAGMENT_RUNS_MAX = 500


def with_csp(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = view(request, *args, **kwargs)
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        return response

    wrapped.__name__ = view.__name__
    wrapped.__doc__ = view.__doc__
    return wrapped


login = with_csp(auth_views.LoginView.as_view(template_name="login.html", redirect_authenticated_user=True))
logout = auth_views.LogoutView.as_view()


def _dump(schema: Any, obj: Any) -> dict[str, Any]:
    # The API's own schemas, so the embedded data and later API answers have one shape.
    return schema.model_validate(obj).model_dump(mode="json")


def _sessions_of(project: Project) -> list[dict[str, Any]]:
    sessions = with_active_run(project.sessions.all())[:SIDEBAR_SESSIONS]
    return [_dump(SessionOut, s) for s in sessions]


def _page(request: HttpRequest, project: Project | None, session: Session | None) -> HttpResponse:
    projects = list(Project.objects.visible_to(request.user))
    data: dict[str, Any] = {
        "user": {"username": request.user.get_username(), "is_staff": request.user.is_staff},
        "projects": [_dump(ProjectOut, p) for p in projects],
        "project": _dump(ProjectOut, project) if project else None,
        "sessions": _sessions_of(project) if project else [],
        "workflows": [_dump(WorkflowOut, w) for w in project.workflows.all()] if project else [],
        "session": _dump(SessionOut, session) if session else None,
        # The composer refuses a larger file before uploading it (or creating a session for it).
        "attachment_max_bytes": settings.HERMESWEB_ATTACHMENT_MAX_BYTES,
    }
    title = (session.title if session else "") or (project.name if project else "")
    modules = import_map(page_modules())
    context = {
        "data": data,
        "page_title": title,
        "session_id": session.pk if session else None,
        "import_map": mark_safe(modules.text),  # JSON with no "<" (static_assets.import_map)
        "preload_modules": module_closure(*ENTRY_MODULES),
    }
    response = render(request, "workbench.html", context)
    response.headers["Content-Security-Policy"] = content_security_policy(modules.csp_source)
    return response


@require_GET
@login_required
@with_csp
def home(request: HttpRequest) -> HttpResponse:
    """Land in the project worked on last (the demo project on a fresh install)."""
    recent = Session.objects.visible_to(request.user).select_related("project").first()
    project = recent.project if recent else Project.objects.visible_to(request.user).first()
    if project is not None:
        return redirect("project", project_id=project.pk)
    return _page(request, None, None)


def _visible(queryset: Any, user: Any, pk: int) -> Any:
    obj = queryset.visible_to(user).filter(pk=pk).first()
    if obj is None:
        raise Http404
    return obj


@require_GET
@login_required
@with_csp
def project_page(request: HttpRequest, project_id: int) -> HttpResponse:
    project = _visible(Project.objects, request.user, project_id)
    return _page(request, project, None)


@require_GET
@login_required
@with_csp
def session_page(request: HttpRequest, session_id: int) -> HttpResponse:
    session = _visible(with_active_run(Session.objects.select_related("project")), request.user, session_id)
    return _page(request, session.project, session)


# ---------------------------------------------------------------- rendered turns


def render_turn(run: Run, events: Iterable[JournalEvent]) -> SafeString:
    """The markdown segments of one run as sanitized HTML, keyed by their index in `materialize` items.

    The browser builds the turn's structure itself (tool cards, approvals …)
    and swaps each text item's live plain text for the matching segment.
    """
    return render_state(run, materialize(events))


def render_state(run: Run, state: dict[str, Any]) -> SafeString:
    segments = format_html_join(
        "",
        '<div class="md" data-item="{}" data-message-id="{}">{}</div>',
        (
            # render_markdown's output went through nh3's allow-list: it is safe by construction.
            (index, item.get("message_id") or "", mark_safe(render_markdown(item.get("text", ""))))
            for index, item in enumerate(state["items"])
            if item["kind"] == "text"
        ),
    )
    return format_html(
        '<section class="turn-fragment" data-run="{}" data-last-seq="{}" data-terminal="{}">{}</section>',
        run.pk,
        state["last_seq"],
        "true" if state["terminal"] else "false",
        segments,
    )


def _fragment_response(turns: Iterable[PagedTurn]) -> HttpResponse:
    # A turn too large for a page of its own stays in the browser's plain text: it is marked so.
    too_large = '<section class="turn-fragment" data-run="{}" data-too-large></section>'
    body = "".join(
        render_state(turn.run, turn.state)
        if turn.complete and not turn.items_from
        else format_html(too_large, turn.run.pk)
        for turn in turns
    )
    response = HttpResponse(body, content_type="text/html; charset=utf-8")
    response.headers["Cache-Control"] = "private, no-cache"
    return response


def _budget() -> int:
    return settings.HERMESWEB_TRANSCRIPT_PAGE_BYTES


@require_GET
@login_required
def run_fragment(request: HttpRequest, session_id: int, run_id: int) -> HttpResponse:
    """One turn's markdown, rendered and sanitized."""
    session = _visible(Session.objects, request.user, session_id)
    run = Run.objects.filter(session=session, pk=run_id).first()
    if run is None:
        raise Http404
    return _fragment_response(page_turns([run], _budget(), skip_oversized=True).turns)


def _id_param(value: str, *, top: int) -> int | None:
    return int(value) if value.isdecimal() and len(value) < 19 and 1 <= int(value) <= top else None


@require_GET
@login_required
def session_fragment(request: HttpRequest, session_id: int) -> HttpResponse:
    """Several settled turns' markdown at once, so a long session loads in few requests.

    `?runs=1,2,3` names the runs; without it, the settled runs of the transcript's page
    (`?before=<run id>&limit=`, the newest by default). Either way the answer stops at
    HERMESWEB_TRANSCRIPT_PAGE_BYTES: ask again for the runs that did not come.
    """
    session = _visible(Session.objects, request.user, session_id)
    if "runs" in request.GET:
        parts = [part for part in request.GET["runs"].split(",") if part]
        if len(parts) > FRAGMENT_RUNS_MAX or not all(part.isdecimal() and len(part) < 19 for part in parts):
            return HttpResponseBadRequest("runs must be a comma-separated list of run ids")
        runs = Run.objects.filter(session=session, pk__in={int(part) for part in parts}).order_by("pk")
        return _fragment_response(page_turns(list(runs), _budget(), skip_oversized=True).turns)
    before_text = request.GET.get("before")
    before = _id_param(before_text, top=MAX_ID) if before_text is not None else None
    limit = _id_param(request.GET.get("limit", str(PAGE_TURNS)), top=PAGE_TURNS_MAX)
    if limit is None or (before_text is not None and before is None):
        return HttpResponseBadRequest(f"before must be a run id, and limit 1 to {PAGE_TURNS_MAX}")
    # Only complete turns are rendered: a turn plainly too large is answered from its size alone.
    page = newest_turns(session.pk, before=before, limit=limit, budget=_budget(), cut_states=False)
    return _fragment_response(turn for turn in page.turns if turn.run.status in TERMINAL_STATUSES)
