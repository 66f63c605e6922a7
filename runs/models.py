"""Runs, their append-only journal, controls and the runner registry.

Design notes: docs/journal.md (events, seq, terminal), docs/runner.md (leases,
controls). The journal is the truth; everything else is derived or a doorbell.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from projects.models import Project, Session


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"
    AWAITING_CLARIFY = "awaiting_clarify"
    CANCELLING = "cancelling"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


ACTIVE_STATUSES = (
    RunStatus.QUEUED,
    RunStatus.RUNNING,
    RunStatus.AWAITING_APPROVAL,
    RunStatus.AWAITING_CLARIFY,
    RunStatus.CANCELLING,
)
EXECUTING_STATUSES = ACTIVE_STATUSES[1:]
TERMINAL_STATUSES = (RunStatus.COMPLETED, RunStatus.CANCELLED, RunStatus.FAILED, RunStatus.INTERRUPTED)


class RunSource(models.TextChoices):
    COMPOSER = "composer"
    WORKFLOW = "workflow"
    QUEUE = "queue"
    STOP_AND_SEND = "stop_and_send"
    LEFTOVER_STEER = "leftover_steer"
    IMPORT = "import"  # a turn of an agent session's history, imported by discovery
    WORKSPACE = "workspace"  # files rewound or restored: journaled, never run (docs/workspace.md)


class RunQuerySet(models.QuerySet["Run"]):
    def active(self) -> RunQuerySet:
        return self.filter(status__in=ACTIVE_STATUSES)

    def executing(self) -> RunQuerySet:
        return self.filter(status__in=EXECUTING_STATUSES)

    def stale(self, now: datetime | None = None) -> RunQuerySet:
        """Executing runs whose lease has lapsed: their runner is gone."""
        now = now or timezone.now()
        return self.executing().filter(Q(lease_expires_at__lt=now) | Q(lease_expires_at__isnull=True))

    def visible_to(self, user: Any) -> RunQuerySet:
        # The user's own, staff too: staff act on others' runs only through the admin.
        return self.filter(session__project__owner=user)

    def count_network_refusal(self, run_ids: set[int]) -> int:
        """One connection the agent serving these runs was refused by its network policy."""
        return self.filter(pk__in=run_ids).update(network_refused=F("network_refused") + 1)


class Run(models.Model):
    # No index of its own: (session, created_at) leads with it. Every index costs each insert.
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="runs", db_index=False)
    client_id = models.CharField(max_length=100)
    prompt_text = models.TextField()
    attachments = models.JSONField(default=list, blank=True)
    source = models.CharField(max_length=20, choices=RunSource.choices, default=RunSource.COMPOSER)
    source_meta = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.QUEUED)
    last_seq = models.PositiveIntegerField(default=0)
    # Compaction may merge events up to this seq; a cursor inside that range is expired.
    compacted_through = models.PositiveIntegerField(default=0)
    stop_reason = models.CharField(max_length=50, blank=True)
    error = models.TextField(blank=True)
    usage = models.JSONField(default=dict, blank=True)
    # Connections the agent tried while this run was active and its network policy refused.
    network_refused = models.PositiveIntegerField(default=0)
    lease_owner = models.CharField(max_length=100, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = RunQuerySet.as_manager()

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["session", "client_id"], name="run_client_id_unique_per_session"),
            # A session never has two active runs: a database fact, not a timing hope.
            models.UniqueConstraint(
                fields=["session"], condition=Q(status__in=ACTIVE_STATUSES), name="one_active_run_per_session"
            ),
        ]
        indexes = [
            models.Index(fields=["status", "created_at"]),
            models.Index(fields=["session", "created_at"]),
        ]

    def __str__(self) -> str:
        return f"Run {self.pk} ({self.status})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    @property
    def last_event_id(self) -> str | None:
        return f"{self.pk}:{self.last_seq}" if self.last_seq else None

    def lease_is_stale(self, now: datetime | None = None) -> bool:
        if self.status not in EXECUTING_STATUSES:
            return False
        now = now or timezone.now()
        return self.lease_expires_at is None or self.lease_expires_at < now


class EventType(models.TextChoices):
    RUN_STARTED = "run.started"
    STATUS = "status"
    TOKEN_DELTA = "token.delta"
    REASONING_DELTA = "reasoning.delta"
    REASONING_DONE = "reasoning.done"
    PROGRESS = "progress"
    TOOL_STARTED = "tool.started"
    TOOL_UPDATED = "tool.updated"
    TOOL_DONE = "tool.done"
    PLAN_UPDATED = "plan.updated"
    APPROVAL_REQUESTED = "approval.requested"
    APPROVAL_RESOLVED = "approval.resolved"
    CLARIFY_REQUESTED = "clarify.requested"
    CLARIFY_RESOLVED = "clarify.resolved"
    STEER_DELIVERED = "steer.delivered"
    TITLE_UPDATED = "title.updated"
    USAGE_UPDATED = "usage.updated"
    USAGE_FINAL = "usage.final"
    TERMINAL_OUTPUT = "terminal.output"
    ERROR = "error"
    FILES_RESTORED = "files.restored"
    DONE = "done"


class JournalEvent(models.Model):
    """One immutable event; `(run, seq)` is unique and seq has no gaps."""

    # No index of its own: the unique (run, seq) leads with it, and every row pays for each index.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events", db_index=False)
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=30, choices=EventType.choices)
    created_at = models.DateTimeField(default=timezone.now)
    terminal = models.BooleanField(default=False)
    payload = models.JSONField(default=dict, blank=True)
    # The envelope's JSON text, spelled when the row was written, on SQLite only: building it
    # there per row was most of a replay's cost. NULL on PostgreSQL, for older rows and for
    # rows compaction rewrote; readers build those (docs/journal.md, "Reading").
    envelope_json = models.TextField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["run_id", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="journal_seq_unique_per_run"),
            models.UniqueConstraint(
                fields=["run"], condition=Q(terminal=True), name="journal_one_terminal_per_run"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event_id} {self.type}"

    @property
    def event_id(self) -> str:
        return f"{self.run_id}:{self.seq}"

    def envelope(self, session_id: int | None = None) -> dict[str, Any]:
        """Artifact 1 of the run adapter contract, exactly."""
        return {
            "event_id": self.event_id,
            "seq": self.seq,
            "run_id": self.run_id,
            "session_id": session_id if session_id is not None else self.run.session_id,
            "type": self.type,
            "created_at": self.created_at.timestamp(),
            "terminal": self.terminal,
            "payload": self.payload,
        }


class ControlKind(models.TextChoices):
    CANCEL = "cancel"
    APPROVAL = "approval"
    CLARIFY = "clarify"
    STEER = "steer"
    GOAL = "goal"


class ControlState(models.TextChoices):
    PENDING = "pending"  # written by the web process, not yet applied by the runner
    APPLIED = "applied"
    REJECTED = "rejected"


class ControlResultStatus(models.TextChoices):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    NOT_ACTIVE = "not_active"
    EXPIRED = "expired"
    UNSUPPORTED = "unsupported"
    CONFLICT = "conflict"


class ControlQuerySet(models.QuerySet["Control"]):
    def pending(self) -> ControlQuerySet:
        return self.filter(state=ControlState.PENDING)

    def record(self, result: str, message: str) -> int:
        """Record the runner's answer to these controls: applied when accepted, else rejected."""
        state = ControlState.APPLIED if result == ControlResultStatus.ACCEPTED else ControlState.REJECTED
        return self.update(state=state, result=result, message=message, applied_at=timezone.now())

    def expire(self, message: str) -> int:
        """Answer pending controls that can no longer be applied (their run or request ended)."""
        return self.pending().update(
            state=ControlState.REJECTED, result=ControlResultStatus.EXPIRED, message=message,
            applied_at=timezone.now(),
        )  # fmt: skip


class Control(models.Model):
    """A durable control request; the runner applies it and records the result."""

    # No index of its own: the unique (run, key) leads with it.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="controls", db_index=False)
    kind = models.CharField(max_length=20, choices=ControlKind.choices)
    target_id = models.CharField(max_length=200, blank=True, help_text="Approval/clarify id, intent id.")
    key = models.CharField(max_length=300, help_text="Idempotency key: a repeat is a duplicate.")
    payload = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=20, choices=ControlState.choices, default=ControlState.PENDING)
    result = models.CharField(max_length=20, choices=ControlResultStatus.choices, blank=True)
    message = models.TextField(blank=True)
    event_seq = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    applied_at = models.DateTimeField(null=True, blank=True)

    objects = ControlQuerySet.as_manager()

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [models.UniqueConstraint(fields=["run", "key"], name="control_key_unique_per_run")]
        indexes = [models.Index(fields=["state", "run"])]

    def __str__(self) -> str:
        return f"{self.kind} {self.target_id} on run {self.run_id} ({self.state})"


class RunnerQuerySet(models.QuerySet["Runner"]):
    def alive(self, now: datetime | None = None) -> RunnerQuerySet:
        now = now or timezone.now()
        horizon = now - timezone.timedelta(seconds=settings.HERMESWEB_LEASE_SECONDS)
        return self.filter(stopped_at__isnull=True, heartbeat_at__gte=horizon)


class Runner(models.Model):
    id = models.CharField(primary_key=True, max_length=100)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField(default=timezone.now)
    heartbeat_at = models.DateTimeField(default=timezone.now)
    stopped_at = models.DateTimeField(null=True, blank=True)
    agent_capabilities = models.JSONField(default=dict, blank=True, help_text="initialize results by agent.")
    # What it can serve (runs.placement): its labels ("host=build-1", "gpu") and project roots.
    labels = models.JSONField(default=list, blank=True)
    roots = models.JSONField(default=list, blank=True)

    objects = RunnerQuerySet.as_manager()

    class Meta:
        ordering = ["-heartbeat_at"]

    def __str__(self) -> str:
        return self.id


class AgentReport(models.Model):
    """What an agent's last `initialize` told a runner: GET /api/agents (runs/agent_catalog.py)."""

    agent = models.CharField(max_length=100, unique=True)
    agent_info = models.JSONField(default=dict, blank=True)
    capabilities = models.JSONField(default=dict, blank=True)
    runner_id = models.CharField(max_length=100, blank=True)
    reported_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.agent


class AgentJobKind(models.TextChoices):
    LIST_SESSIONS = "list_sessions"
    IMPORT_SESSION = "import_session"


class AgentJobState(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class AgentJobQuerySet(models.QuerySet["AgentJob"]):
    def visible_to(self, user: Any) -> AgentJobQuerySet:
        return self.filter(project__owner=user)  # staff too, as RunQuerySet.visible_to


class AgentJob(models.Model):
    """Agent work asked for by the web process and done by a runner (docs/operations.md).

    The web process owns no agent, so session discovery and import are durable
    rows a runner claims, executes and answers in `result` (or `error`).
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="agent_jobs")
    kind = models.CharField(max_length=30, choices=AgentJobKind.choices)
    payload = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=20, choices=AgentJobState.choices, default=AgentJobState.PENDING)
    result = models.JSONField(default=dict, blank=True)
    error_code = models.CharField(max_length=50, blank=True)
    error = models.TextField(blank=True)
    runner_id = models.CharField(max_length=100, blank=True, help_text="The runner that claimed it.")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = AgentJobQuerySet.as_manager()

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["state", "created_at"])]

    def __str__(self) -> str:
        return f"{self.kind} job {self.pk} ({self.state})"


class SearchDocument(models.Model):
    """A settled run's searchable text: one row per run (runs/search.py, docs/search.md).

    The full-text index over it belongs to the database and is not in this model
    (migration 0004): a stored, weighted `tsvector` column with a GIN index on
    PostgreSQL; an FTS5 table kept in step by triggers on SQLite.
    """

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="search_document")
    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="+")
    # The project's owner when the run settled; searches also check the live ownership.
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    prompt = models.TextField(blank=True)
    answer = models.TextField(blank=True, help_text="The run's text (its answer), as materialized.")
    tools = models.TextField(blank=True, help_text="Its tool calls' titles, one per line.")
    created_at = models.DateTimeField(help_text="The run's.")
    indexed_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"search document of run {self.run_id}"


class Attachment(models.Model):
    """A file the user uploaded to a session, sent to the agent with a message (docs/agents.md).

    The bytes live under the data directory at `path` (relative to it, never inside a
    project or an allowed root); runs.attachments writes them and removes them with the row.
    """

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="attachments")
    name = models.CharField(max_length=255)
    mime_type = models.CharField(max_length=100, help_text="Detected from the content, not the client.")
    size = models.PositiveBigIntegerField()
    sha256 = models.CharField(max_length=64)
    path = models.CharField(max_length=500, help_text="Relative to the data directory.")
    created_at = models.DateTimeField(default=timezone.now)
    # Set when a message first names it; one never named is removed after a day (remove_unsent).
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [
            models.Index(
                fields=["created_at"], condition=models.Q(sent_at__isnull=True), name="attachment_unsent"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.mime_type}, session {self.session_id})"

    @property
    def is_image(self) -> bool:
        return self.mime_type.startswith("image/")

    def described(self) -> dict[str, Any]:
        """What a run stores and the API answers: no path, no hash."""
        return {"id": self.pk, "name": self.name, "mime_type": self.mime_type, "size": self.size}


class WarmRequest(models.Model):
    """A session's page was opened or typed in: a runner may start its agent before the turn.

    A hint (docs/runner.md, "Warm-up and memory"): one row per session, taken (deleted) by the
    runner that warms it; a stale one is dropped unread, and no turn ever waits for it.
    """

    session = models.OneToOneField(Session, primary_key=True, on_delete=models.CASCADE, related_name="+")
    requested_at = models.DateTimeField(default=timezone.now, db_index=True)

    def __str__(self) -> str:
        return f"warm session {self.session_id}"
