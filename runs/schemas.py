"""API shapes for messages, runs, their journal and controls (Artifact 1 of the run adapter RFC)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from ninja import Field, Schema
from pydantic import StringConstraints

from intents.schemas import MAX_ID, BodyInt, IntentPreviewOut
from projects.schemas import WaitingOut

ClientId = Annotated[str, StringConstraints(min_length=1, max_length=100)]
MessageText = Annotated[str, StringConstraints(min_length=1, max_length=1_000_000)]
AttachmentId = Annotated[BodyInt, Field(ge=1, le=MAX_ID)]
MAX_MESSAGE_ATTACHMENTS = 20


class AttachmentOut(Schema):
    """An uploaded file, as a message's `attachments` and a turn's stored list name it."""

    id: int
    name: str
    mime_type: str = Field(description="Detected from the content: image/png|jpeg|gif|webp, or a text type.")
    size: int = Field(description="Bytes.")


class MessageIn(Schema):
    client_id: ClientId = Field(
        description="Client-generated id; sending it again is a duplicate, never a turn."
    )
    text: MessageText
    mode: Literal["auto", "queue", "steer"] = Field(
        "auto", description="While a run is active: queue it, steer the run, or the project's default."
    )
    attachments: list[AttachmentId] | None = Field(
        None,
        max_length=MAX_MESSAGE_ATTACHMENTS,
        description="Ids of this session's uploads (`POST /sessions/{id}/attachments`), sent with the text.",
    )
    mentions: list[Annotated[str, StringConstraints(min_length=1, max_length=4096)]] | None = Field(
        None,
        max_length=20,
        description="Project-relative paths the text `@`-mentions: sent to the agent as resource links "
        "(small text files embedded when it takes them), stored beside the attachments (docs/workspace.md).",
    )


class SubmitOut(Schema):
    kind: str = Field(description="run | queue | steer (a duplicate of a stop-and-send item: stop_and_send)")
    run_id: int | None
    intent_id: int | None
    status: str
    duplicate: bool

    @classmethod
    def from_result(cls, result: Any) -> SubmitOut:
        """From a runs.services.SubmitResult."""
        return cls(
            kind=result.kind,
            run_id=result.run.pk if result.run else None,
            intent_id=result.intent.pk if result.intent else None,
            status=result.status,
            duplicate=result.duplicate,
        )


class EventOut(Schema):
    """The event envelope, exactly."""

    event_id: str
    seq: int
    run_id: int
    session_id: int
    type: str
    created_at: float
    terminal: bool
    payload: dict[str, Any]


class EventsPage(Schema):
    run_id: int
    events: list[EventOut]
    last_seq: int
    terminal: bool
    has_more: bool


class RunStatusOut(Schema):
    """Reconnect metadata: enough to resume a run's display from a cursor."""

    run_id: int
    session_id: int
    status: str
    source: str
    prompt_text: str = Field(description="What the user sent: lets a client draw a turn it just discovered.")
    last_seq: int
    last_event_id: str | None
    terminal: bool
    terminal_state: str | None
    stop_reason: str | None
    controls: list[str] = Field(description="Controls available now, e.g. ['cancel', 'steer'].")
    pending_approval_ids: list[str]
    pending_clarify_ids: list[str]
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    error: str | None
    usage: dict[str, Any]
    network_refused: int = Field(
        0, description="Connections its network policy refused the agent in the run."
    )
    waiting: WaitingOut | None = Field(None, description="Why it is still queued (runs/capacity.py).")


ControlTarget = Annotated[str, StringConstraints(min_length=1, max_length=200)]


class ApprovalIn(Schema):
    option_id: Annotated[str, StringConstraints(min_length=1, max_length=200)]


class ClarifyIn(Schema):
    answer: dict[str, Any] | Annotated[str, StringConstraints(max_length=100_000)] = Field(
        description="Text, or an object of field → value for a structured question."
    )


class GoalIn(Schema):
    action: Annotated[str, StringConstraints(min_length=1, max_length=20)] = Field(
        description="set | pause | resume | clear | status | edit"
    )
    text: Annotated[str, StringConstraints(max_length=100_000)] | None = None


class WarmOut(Schema):
    """A warm-up asked of the runners (runs/warm_requests.py): a hint, never a turn's condition."""

    requested: bool
    reason: Literal["requested", "recent", "busy", "archived"] = Field(
        description="requested | recent (asked within the interval) | busy (a turn has the agent) | archived"
    )


class ControlResultOut(Schema):
    accepted: bool
    status: str = Field(description="accepted | duplicate | not_active | expired | unsupported | conflict")
    event_id: str | None = None
    message: str


class TurnOut(Schema):
    """One run as the transcript shows it: the user's prompt and the materialized events."""

    run_id: int
    client_id: str
    status: str
    source: str
    source_meta: dict[str, Any]
    prompt_text: str
    attachments: list[Any]
    last_seq: int
    error: str | None
    usage: dict[str, Any]
    network_refused: int = 0
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    state: dict[str, Any] = Field(
        description="runs.transcript.materialize() of the run's events, without `text` and `reasoning`: "
        "the run's text and reasoning are in `items` (text and reasoning items, in order), each once."
    )
    complete: bool = Field(
        True,
        description="False when `state` stops at `state.last_seq` to bound the page: read the rest "
        "from GET /runs/{id}/events?after_seq=<state.last_seq> (or the socket, from that cursor).",
    )
    items_from: int = Field(
        0,
        description="A finished run larger than the page comes from its end: this many of its first "
        "items are left out of `state.items` (read them from GET /runs/{id}/items?before=<items_from>).",
    )


class RunItemsOut(Schema):
    """A finished run's items before an index, a bounded page of them (a turn come from its end)."""

    run_id: int
    items: list[dict[str, Any]] = Field(description="The run's items `items_from` to `before` - 1, in order.")
    items_from: int = Field(description="The index of the first item here; 0: there are none before it.")
    last_seq: int


class TranscriptOut(Schema):
    session_id: int
    title: str
    status: str
    active_run_id: int | None
    turns: list[TurnOut] = Field(description="One page of turns, oldest first: the newest unless `before`.")
    has_more: bool = Field(False, description="Older turns exist: ask again with `before=<before>`.")
    before: int | None = Field(None, description="The cursor for the next older page (its first run id).")
    intents: list[IntentPreviewOut] = Field(
        description="The session's open intents (waiting or stopping), in queue order, each text a preview "
        "as GET /sessions/{id}/intents sends it: the whole text is at GET /intents/{id}."
    )


# ---------------------------------------------------------------- session discovery (agent jobs)


class ImportIn(Schema):
    agent_session_id: Annotated[str, StringConstraints(min_length=1, max_length=200)] = Field(
        description="A `sessionId` from the agent's session list (`POST /projects/{id}/discover`)."
    )


class JobError(Schema):
    code: str = Field(
        description="agent_unknown | agent_start_failed | agent_died | agent_timeout | list_unsupported | "
        "list_failed | load_unsupported | load_failed | empty_history | session_busy | runner_lost | "
        "runner_shutdown | runner_error"
    )
    message: str


class JobOut(Schema):
    """An agent job: the runner does the ACP work; poll until `state` is done or failed."""

    id: int
    kind: str = Field(description="list_sessions | import_session")
    project_id: int
    state: str = Field(description="pending | running | done | failed")
    payload: dict[str, Any]
    result: dict[str, Any] | None = Field(
        description="list_sessions: {sessions: [{agent_session_id, cwd, title, updated_at, session_id}], "
        "truncated}, where session_id is the hermesweb session already holding it (or null); "
        "import_session: {session_id, agent_session_id, created, turns}."
    )
    error: JobError | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class SearchHitOut(Schema):
    """One settled run that contains every word of the query (docs/search.md)."""

    session_id: int
    session_title: str = Field(description="The session's title now; may be empty (untitled).")
    project_id: int
    project_name: str
    run_id: int = Field(description="The turn: open /sessions/{session_id}/#run-{run_id}.")
    snippet: str = Field(
        description="HTML: the matching text, every character escaped; the only markup is "
        "<mark>…</mark> around the matches."
    )
    created_at: datetime = Field(description="When the turn was sent.")
    rank: float = Field(description="The database's relevance score; only its order means anything.")


class SearchPageOut(Schema):
    query: str
    terms: list[str] = Field(description="The words searched for, all required; any query syntax is ignored.")
    page: int
    page_size: int
    total: int = Field(description="Hits on all pages.")
    has_next: bool
    hits: list[SearchHitOut] = Field(description="Best first; ties: the newest first.")


class AgentOut(Schema):
    """One of the operator's configured agents (runs/agent_catalog.py)."""

    name: str = Field(description="The id a project's `agent` names.")
    label: str = Field(description="What people call it: the agent's own title once it reported one.")
    default: bool = Field(description="The operator's default agent (a project given none gets it).")
    can_start: bool = Field(description="Whether a runner here could start it now.")
    why_not: str = Field(description="Why it cannot start (its command missing, the sandbox it requires…).")
    sandbox: str = Field(description='Where it would run: "bubblewrap" or "none"; "" if it cannot start.')
    sandbox_setting: str = Field(description='Its entry\'s `sandbox`: "auto", "required" or "none".')
    capabilities: dict[str, Any] = Field(
        description="`agentCapabilities` from its last initialize (empty: no runner started it yet)."
    )
    agent_info: dict[str, Any] = Field(description="`agentInfo` from that initialize: name, title, version.")
    reported_at: datetime | None = Field(description="When a runner last initialized it.")
