"""Messages, transcripts, runs, their journal and controls.

Thin views over runs.services / runs.controls / runs.journal. A control always
answers 200 with a bounded ControlResult — "not_active", "duplicate" … are
answers, not errors; 404 means only that the run is not yours (or not there).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.http import FileResponse, HttpRequest, HttpResponse, StreamingHttpResponse
from django.utils.text import slugify
from ninja import File, Header, Path, Query, Router, Status, UploadedFile

from hermesweb.auth import get_visible
from hermesweb.errors import MAX_ID, ApiError, ErrorOut, not_found
from intents.previews import open_previews
from projects.models import Project, Session
from projects.schemas import SessionOut
from runs import (
    agent_catalog,
    attachments,
    controls,
    discovery,
    export,
    fork,
    journal,
    search,
    transcript_pages,
)
from runs import services as run_services
from runs.models import AgentJob, AgentJobKind, AgentJobState, Attachment, Run
from runs.schemas import (
    AgentOut,
    ApprovalIn,
    AttachmentOut,
    ClarifyIn,
    ControlResultOut,
    EventsPage,
    GoalIn,
    ImportIn,
    JobError,
    JobOut,
    MessageIn,
    RunItemsOut,
    RunStatusOut,
    SearchHitOut,
    SearchPageOut,
    SubmitOut,
    TranscriptOut,
    TurnOut,
    WarmOut,
)
from runs.warm_requests import do_request_warm

router = Router()

# Ids the agent chose (approval, clarify): any text but NUL, which PostgreSQL cannot store.
AgentId = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[^\x00]+$")]


def control_out(result: controls.ControlResult) -> ControlResultOut:
    return ControlResultOut(
        accepted=result.accepted, status=result.status, event_id=result.event_id, message=result.message
    )


# ---------------------------------------------------------------- messages and transcript


@router.post("/sessions/{id}/messages", response={202: SubmitOut}, tags=["sessions"])
def submit_message(request: HttpRequest, id: int, payload: MessageIn) -> Status[SubmitOut]:
    """Send a message: a new turn when the session is idle, else a queued or steering intent.

    The same `client_id` again returns the first answer with `duplicate: true`.
    409 `session_archived` for an archived session; 422 `queue_full` when the session already has
    HERMESWEB_MAX_QUEUED_INTENTS open intents; 404 `not_found` when `attachments` names an id
    that is not an upload of this session.
    """
    if not 1 <= id <= MAX_ID:
        raise not_found("session")
    try:
        result = run_services.do_submit_message_as(
            request.auth,
            id,
            client_id=payload.client_id,
            text=payload.text,
            mode=payload.mode,
            attachments=payload.attachments,
            mentions=payload.mentions,
        )
    except Session.DoesNotExist:
        raise not_found("session") from None
    return Status(202, SubmitOut.from_result(result))


@router.post("/sessions/{id}/fork", response={201: SessionOut}, tags=["sessions"])
def fork_session(request: HttpRequest, id: int) -> Status[Session]:
    """Fork a session: a new session in the same project whose transcript starts with this one's.

    The agent session is forked (ACP `session/fork`) on the new session's first turn. 409
    `session_archived` / `project_archived`, 409 `session_busy` while a turn is queued or running,
    422 `unsupported` when there is no agent session yet or the agent cannot fork, 422
    `agent_unavailable` when no runner has started the agent yet to say, 409 `too_many_sessions`
    past the owner's cap. Each call makes a new fork.
    """
    if not 1 <= id <= MAX_ID:
        raise not_found("session")
    try:
        forked = fork.do_fork_session(request.auth, id)
    except Session.DoesNotExist:
        raise not_found("session") from None
    return Status(201, forked)


@router.post("/sessions/{id}/warm", response={202: WarmOut}, tags=["sessions"])
def warm_session(request: HttpRequest, id: int) -> Status[WarmOut]:
    """Ask a runner to start this session's agent before its next turn (opening it, typing in it).

    A hint: at most one per session per HERMESWEB_WARM_INTERVAL_SECONDS; `requested: false` says why not.
    """
    session = get_visible(Session.objects.select_related("project"), request.auth, id, "session")
    answer = do_request_warm(session)
    return Status(202, WarmOut(requested=answer.requested, reason=answer.reason))


def turn_out(turn: transcript_pages.PagedTurn) -> TurnOut:
    run = turn.run
    return TurnOut(
        run_id=run.pk,
        client_id=run.client_id,
        status=run.status,
        source=run.source,
        source_meta=run.source_meta,
        prompt_text=run.prompt_text,
        attachments=run.attachments,
        last_seq=run.last_seq,
        error=run.error or None,
        usage=run.usage,
        network_refused=run.network_refused,
        created_at=run.created_at,
        started_at=run.started_at,
        finished_at=run.finished_at,
        state=transcript_pages.page_state(turn.state),
        complete=turn.complete,
        items_from=turn.items_from,
    )


@router.get("/sessions/{id}/transcript", response=TranscriptOut, tags=["sessions"])
def transcript(
    request: HttpRequest,
    id: int,
    before: Annotated[
        int | None, Query(ge=1, le=MAX_ID, description="Only turns older than this run id.")
    ] = None,
    limit: Annotated[
        int, Query(ge=1, le=transcript_pages.PAGE_TURNS_MAX, description="Turns per page, at most.")
    ] = transcript_pages.PAGE_TURNS,
    after_run: Annotated[
        int | None, Query(ge=0, le=MAX_ID, description="Only turns newer than this run id.")
    ] = None,
) -> TranscriptOut:
    """A page of the session's turns, oldest first, with their events materialized, plus the open intents.

    The newest page unless `before`; `has_more` says older turns exist (pass `before` on). A page
    also stops at HERMESWEB_TRANSCRIPT_PAGE_BYTES: a single larger turn comes with `complete`
    false, its state cut at `state.last_seq`, to be read on from the run's events. A state has no
    `text` or `reasoning`: they are in its `items`, each once. `after_run`
    leaves out that run and older ones (a page re-reading only the turns it does not hold); then
    `has_more` says turns newer than `after_run` but older than the page exist.
    """
    session = get_visible(Session.objects, request.auth, id, "session")
    page = transcript_pages.newest_turns(
        session.pk,
        before=before,
        after=after_run,
        limit=limit,
        budget=settings.HERMESWEB_TRANSCRIPT_PAGE_BYTES,
    )
    turns = [turn_out(turn) for turn in page.turns]
    active = Run.objects.filter(session=session).active().values_list("pk", flat=True).first()
    return TranscriptOut(
        session_id=session.pk,
        title=session.title,
        status=session.status,
        active_run_id=active,
        turns=turns,
        has_more=page.has_more,
        before=page.turns[0].run.pk if page.has_more and page.turns else None,
        intents=open_previews(session),
    )


# ---------------------------------------------------------------- runs and their journal


@router.get("/runs/{id}", response=RunStatusOut, tags=["runs"])
def run_status(request: HttpRequest, id: int) -> dict[str, Any]:
    """Reconnect metadata: status, cursor, terminal state, available controls, open requests."""
    run = get_visible(Run.objects, request.auth, id, "run")
    return controls.run_status(run)


def _cursor_from_header(run: Run, last_event_id: str | None) -> int:
    """`Last-Event-ID: <run_id>:<seq>` as an SSE client would resend it; 0 when absent or another run's."""
    if not last_event_id:
        return 0
    run_part, _, seq_part = last_event_id.partition(":")
    if run_part != str(run.pk) or not seq_part.isdecimal() or len(seq_part) > 18:
        return 0
    return int(seq_part)


NEXT_LINK_HEADER = {
    "description": 'While `has_more`, the next page (RFC 8288): `<…?after_seq=N[&limit=L]>; rel="next"`.',
    "schema": {"type": "string"},
}


@router.get(
    "/runs/{id}/events",
    response={200: EventsPage, 409: ErrorOut, 410: ErrorOut},
    tags=["runs"],
    openapi_extra={"responses": {200: {"headers": {"Link": NEXT_LINK_HEADER}}}},
)
def run_events(
    request: HttpRequest,
    id: int,
    after_seq: Annotated[int | None, Query(ge=0, description="Return events with seq > after_seq.")] = None,
    limit: Annotated[int | None, Query(ge=1, description="Page size; capped by the server.")] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> HttpResponse:
    """A page of the run's journal after a cursor (`after_seq`, else `Last-Event-ID`, else 0).

    409 `cursor_ahead` for a cursor the run never reached; 410 `cursor_expired`
    when those events were compacted away — reload the transcript then. While `has_more`,
    a `Link: <…>; rel="next"` header names the next page.
    """
    run = get_visible(Run.objects, request.auth, id, "run")
    cursor = after_seq if after_seq is not None else _cursor_from_header(run, last_event_id)
    try:
        page = journal.read_encoded_array(run, cursor, limit)
    except journal.CursorAhead as exc:
        raise ApiError(409, "cursor_ahead", str(exc), {"last_seq": run.last_seq}) from None
    except journal.CursorExpired as exc:
        raise ApiError(
            410, "cursor_expired", str(exc), {"compacted_through": run.compacted_through}
        ) from None
    # The envelopes are JSON already (journal.read_encoded says why): the body is assembled,
    # not validated and re-encoded; EventsPage still documents it, and tests hold it to it.
    body = (
        f'{{"run_id":{run.pk},"events":{page.text},"last_seq":{page.last_seq},'
        f'"terminal":{_json_bool(page.terminal)},"has_more":{_json_bool(page.has_more)}}}'
    )
    response = HttpResponse(body, content_type="application/json")
    if page.has_more:
        # RFC 8288's next link: a client can ask for the next page before it parses this one.
        limit_part = f"&limit={limit}" if limit is not None else ""
        response["Link"] = f'<{request.path}?after_seq={page.next_after}{limit_part}>; rel="next"'
    return response


@router.get("/runs/{id}/items", response={200: RunItemsOut, 409: ErrorOut}, tags=["runs"])
def run_items(
    request: HttpRequest,
    id: int,
    before: Annotated[int, Query(ge=1, le=MAX_ID, description="Items before this index (`items_from`).")],
) -> RunItemsOut:
    """A finished run's items before `before`, the nearest ones within the transcript's page
    budget (at least one): a turn that came from its end (`items_from`), read back a page at a time.

    409 `run_not_finished` while the run goes on (its items are still changing: read its events);
    409 `run_too_large` for a run too large to keep folded (its page never comes from its end).
    """
    run = get_visible(Run.objects, request.auth, id, "run")
    if not run.is_terminal:
        raise ApiError(409, "run_not_finished", "The run is still going on: read its events instead.")
    try:
        page = transcript_pages.items_before(run, before, settings.HERMESWEB_TRANSCRIPT_PAGE_BYTES)
    except transcript_pages.TooLargeToReadBack:
        message = "The run is too large to read by items: read its events."
        raise ApiError(409, "run_too_large", message) from None
    return RunItemsOut(run_id=run.pk, items=page.items, items_from=page.items_from, last_seq=run.last_seq)


def _json_bool(value: bool) -> str:
    return "true" if value else "false"


# ---------------------------------------------------------------- controls


@router.post("/runs/{id}/cancel", response=ControlResultOut, tags=["controls"])
def cancel_run(request: HttpRequest, id: int) -> ControlResultOut:
    """Ask for a graceful cancel; one terminal `done` event follows."""
    run = get_visible(Run.objects, request.auth, id, "run")
    return control_out(controls.do_cancel(run))


@router.post("/runs/{id}/approvals/{approval_id}", response=ControlResultOut, tags=["controls"])
def respond_approval(
    request: HttpRequest, id: int, approval_id: AgentId, payload: ApprovalIn
) -> ControlResultOut:
    """Answer a permission request with one of its options. 422 `invalid_option` for another option."""
    run = get_visible(Run.objects, request.auth, id, "run")
    return control_out(controls.do_respond_approval(run, approval_id, payload.option_id))


@router.post("/runs/{id}/clarifications/{clarify_id}", response=ControlResultOut, tags=["controls"])
def respond_clarify(
    request: HttpRequest, id: int, clarify_id: AgentId, payload: ClarifyIn
) -> ControlResultOut:
    """Answer a clarify question: a string, or an object of field → value."""
    run = get_visible(Run.objects, request.auth, id, "run")
    return control_out(controls.do_respond_clarify(run, clarify_id, payload.answer))


@router.post("/sessions/{id}/goal", response=ControlResultOut, tags=["controls"])
def session_goal(request: HttpRequest, id: int, payload: GoalIn) -> ControlResultOut:
    """Goal control (set/pause/resume/clear/status/edit) where the agent offers goals."""
    session = get_visible(Session.objects.select_related("project"), request.auth, id, "session")
    return control_out(controls.do_goal(session, payload.action, payload.text))


# ---------------------------------------------------------------- export

ExportFormat = Literal["markdown", "json"]


@router.get(
    "/sessions/{id}/export",
    tags=["sessions"],
    response={200: None},
    openapi_extra={
        "responses": {
            200: {
                "description": "The transcript as a download: `text/markdown` or `application/json`.",
                "content": {"text/markdown": {}, "application/json": {}},
            }
        }
    },
)
def export_session(
    request: HttpRequest,
    id: int,
    format: Annotated[ExportFormat, Query(description="markdown (default) or json")] = "markdown",
) -> StreamingHttpResponse:
    """The session's transcript, materialized from the journal, as a Markdown or JSON attachment.

    Streamed a turn at a time (runs/export.py): a long session costs the memory of one run.
    """
    session = get_visible(Session.objects.select_related("project"), request.auth, id, "session")
    stem = f"{slugify(session.title)[:60] or 'session'}-{session.pk}"
    if format == "json":
        chunks, content_type, suffix = export.json_chunks(session), "application/json", "json"
    else:
        chunks, content_type, suffix = export.markdown_chunks(session), "text/markdown; charset=utf-8", "md"
    # Under ASGI a synchronous generator would be collected whole before the first byte goes out.
    content = export.streamed(chunks) if isinstance(request, ASGIRequest) else chunks
    response = StreamingHttpResponse(content, content_type=content_type)
    response["Content-Disposition"] = f'attachment; filename="{stem}.{suffix}"'
    return response


# ---------------------------------------------------------------- session discovery (agent jobs)


def job_out(job: AgentJob) -> JobOut:
    result: dict[str, Any] | None = job.result if job.state == AgentJobState.DONE else None
    if result is not None and job.kind == AgentJobKind.LIST_SESSIONS:
        # Which listed sessions this project already holds: read now, not when the agent was asked.
        listed = result.get("sessions") or []
        held = dict(
            Session.objects.filter(
                project_id=job.project_id, agent_session_id__in=[s.get("agent_session_id") for s in listed]
            )
            .order_by("-pk")
            .values_list("agent_session_id", "pk")
        )
        result = {
            **result,
            "sessions": [{**s, "session_id": held.get(s.get("agent_session_id"))} for s in listed],
        }
    error = JobError(code=job.error_code, message=job.error) if job.state == AgentJobState.FAILED else None
    return JobOut(
        id=job.pk,
        kind=job.kind,
        project_id=job.project_id,
        state=job.state,
        payload=job.payload,
        result=result,
        error=error,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
    )


@router.post("/projects/{id}/discover", response={202: JobOut}, tags=["discovery"])
def discover_sessions(request: HttpRequest, id: int) -> Status[JobOut]:
    """List the agent's own sessions in the project's directory (`session/list`), through a runner.

    Answers a job at once; poll `GET /jobs/{id}` until it is done. Each listed
    session says which hermesweb session already holds it (`session_id`).
    """
    project = get_visible(Project.objects, request.auth, id, "project")
    return Status(202, job_out(discovery.request_discovery(project, request.auth)))


@router.post("/projects/{id}/import", response={202: JobOut}, tags=["discovery"])
def import_session(request: HttpRequest, id: int, payload: ImportIn) -> Status[JobOut]:
    """Import an agent session as a hermesweb session whose history is journaled once.

    Idempotent: an agent session already imported in this project answers a
    done job with the same `session_id`; a pending request for it is reused.
    Only an id the project's latest discovery listed is imported: any other is 404. 409
    `too_many_sessions` when the owner's sessions and open imports reach their cap.
    """
    project = get_visible(Project.objects, request.auth, id, "project")
    try:
        job = discovery.request_import(project, payload.agent_session_id, request.auth)
    except discovery.NotDiscovered:
        raise not_found("agent session") from None
    return Status(202, job_out(job))


@router.get("/jobs/{id}", response=JobOut, tags=["discovery"])
def get_job(request: HttpRequest, id: int) -> JobOut:
    """A discovery or import job: its state, then its result or error."""
    return job_out(get_visible(AgentJob.objects, request.auth, id, "job"))


# ---------------------------------------------------------------- search


@router.get("/search", response=SearchPageOut, tags=["search"])
def search_sessions(
    request: HttpRequest,
    q: Annotated[str, Query(description="Words to find, all of them (at most 200 characters).")] = "",
    page: Annotated[int, Query(ge=1, le=1000)] = 1,
    page_size: Annotated[int, Query(ge=1, le=50)] = search.PAGE_SIZE,
) -> SearchPageOut:
    """The caller's settled turns whose prompt, answer or tool titles hold every word of `q`.

    Best first, a page at a time; each hit names its session and run and carries a snippet
    (HTML: escaped text, matches in `<mark>`). 422 `query_empty` / `query_too_long`.
    """
    found = search.search(request.auth, q, page=page, page_size=page_size)
    return SearchPageOut(
        query=q.strip(),
        terms=found.terms,
        page=page,
        page_size=page_size,
        total=found.total,
        has_next=page * page_size < found.total,
        hits=[SearchHitOut(**vars(hit)) for hit in found.hits],
    )


# ---------------------------------------------------------------- attachments


@router.post("/sessions/{id}/attachments", response={201: AttachmentOut}, tags=["sessions"])
def upload_attachment(request: HttpRequest, id: int, file: File[UploadedFile]) -> Status[AttachmentOut]:
    """Upload a file (multipart, field `file`) to send with a later message's `attachments`.

    The type comes from the content: PNG, JPEG, GIF or WebP images, or UTF-8 text. 413
    `attachment_too_large` past HERMESWEB_ATTACHMENT_MAX_BYTES; 422 `unsupported_attachment`
    for any other content, or an image when the session's agent does not take images.
    """
    if not 1 <= id <= MAX_ID:
        raise not_found("session")
    upload = attachments.Upload(file.name or "attachment", file.chunks(), file.size)
    try:
        stored = attachments.do_upload_attachment(request.auth, id, upload)
    except Session.DoesNotExist:
        raise not_found("session") from None
    return Status(201, AttachmentOut(**stored.described()))


@router.get("/agents", response=list[AgentOut], tags=["agents"])
def list_agents(request: HttpRequest) -> list[agent_catalog.AgentEntry]:
    """The operator's configured agents: whether each can start here (and why not), its sandbox,
    and the capabilities its last `initialize` reported (runs/agent_catalog.py)."""
    return agent_catalog.list_agents()


@router.get("/attachments/{id}/content", tags=["sessions"], response={200: None})
def attachment_content(request: HttpRequest, id: int) -> FileResponse:
    """The file's bytes, to its owner only: images inline (thumbnails), text as text/plain."""
    if not 1 <= id <= MAX_ID:
        raise not_found("attachment")
    try:
        stored = attachments.owned_attachment(request.auth, id)
        handle = attachments.absolute_path(stored).open("rb")
    except (Attachment.DoesNotExist, FileNotFoundError):
        raise not_found("attachment") from None
    # Never an HTML or script type from this origin: text is served as plain text, sandboxed.
    image = stored.is_image
    response = FileResponse(
        handle,
        as_attachment=not image,
        filename=stored.name,
        content_type=stored.mime_type if image else "text/plain; charset=utf-8",
    )
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    response["Cache-Control"] = "private, max-age=3600"
    return response
