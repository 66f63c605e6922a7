"""Session discovery and import: the rows a runner's agent jobs read and write.

Design note: docs/operations.md ("Session discovery"). The web process owns no
agent, so it writes an `AgentJob` row and rings the doorbell; a runner claims the
job (a conditional UPDATE, SKIP LOCKED on PostgreSQL), talks ACP through its
AgentPool (runs/runner/jobs.py) and records the result here. A job whose runner
vanished is failed by any other runner; asking again is safe because an import is
idempotent by (project, agent session id).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from projects.models import Project, Session
from projects.services import hold_owner, hold_session_room
from runs import journal, notify, search
from runs.journal import NewEvent, done_event
from runs.journal.payloads import RunDetails, RunStarted
from runs.models import AgentJob, AgentJobKind, AgentJobState, EventType, Run, Runner, RunSource, RunStatus
from runs.redaction import redact, redact_text


@dataclass(frozen=True)
class JobContext:
    """What a runner needs to execute one claimed job."""

    job_id: int
    kind: str
    payload: dict[str, Any]
    project_id: int
    project_name: str
    cwd: str
    agent: str


@dataclass
class ImportedTurn:
    """One turn of a replayed history: its prompt and the events the agent produced for it."""

    prompt: str
    events: list[NewEvent]


@dataclass
class ImportedHistory:
    turns: list[ImportedTurn]
    title: str | None = None
    commands: list[dict[str, Any]] | None = None


# ---------------------------------------------------------------- asked for by the web


def request_discovery(project: Project, user: Any = None) -> AgentJob:
    job = AgentJob.objects.create(project=project, kind=AgentJobKind.LIST_SESSIONS, requested_by=_user(user))
    notify.wake_runners("job.queued")
    return job


class NotDiscovered(Exception):
    """An import of an agent session the project's latest discovery did not list."""


def discovered_ids(project_id: int) -> set[str]:
    """The agent session ids the project's latest finished discovery listed (its job's result)."""
    done = AgentJob.objects.filter(
        project_id=project_id, kind=AgentJobKind.LIST_SESSIONS, state=AgentJobState.DONE
    )
    job = done.order_by(F("finished_at").desc(nulls_last=True), "-pk").first()
    if job is None:
        return set()
    listed = (job.result or {}).get("sessions") or []
    return {s["agent_session_id"] for s in listed if isinstance(s, dict) and s.get("agent_session_id")}


def request_import(project: Project, agent_session_id: str, user: Any = None) -> AgentJob:
    """Ask for an import; an already imported session answers at once, an open request is reused.

    Only an id the project's latest discovery returned is imported (else NotDiscovered): the
    discovery ran the owner's agent, with the owner's session store, in this project's
    directory, so an id guessed or seen elsewhere never reaches `session/load`. Conflict
    `too_many_sessions` when the owner's sessions and open imports reach their cap.
    """
    with transaction.atomic():
        # Serialise import requests of one project so two clicks make one job.
        project = Project.objects.select_for_update().get(pk=project.pk)
        existing = imported_session(project.pk, agent_session_id)
        if existing is not None:
            now = timezone.now()
            return AgentJob.objects.create(
                project=project,
                kind=AgentJobKind.IMPORT_SESSION,
                payload={"agent_session_id": agent_session_id},
                state=AgentJobState.DONE,
                result=import_result(existing, created=False),
                requested_by=_user(user),
                started_at=now,
                finished_at=now,
            )
        if agent_session_id not in discovered_ids(project.pk):
            raise NotDiscovered(agent_session_id)
        open_job = AgentJob.objects.filter(
            project=project,
            kind=AgentJobKind.IMPORT_SESSION,
            state__in=(AgentJobState.PENDING, AgentJobState.RUNNING),
            payload__agent_session_id=agent_session_id,
        ).first()
        if open_job is not None:
            return open_job
        # Each open import becomes a session: promised ones count toward the owner's cap.
        hold_owner(project.owner_id)
        promised = AgentJob.objects.filter(
            project__owner_id=project.owner_id,
            kind=AgentJobKind.IMPORT_SESSION,
            state__in=(AgentJobState.PENDING, AgentJobState.RUNNING),
        ).count()
        hold_session_room(project.owner_id, pending=promised)
        job = AgentJob.objects.create(
            project=project,
            kind=AgentJobKind.IMPORT_SESSION,
            payload={"agent_session_id": agent_session_id},
            requested_by=_user(user),
        )
        notify.wake_runners("job.queued")
    return job


def _user(user: Any) -> Any:
    return user if user is not None and getattr(user, "pk", None) else None


def imported_session(project_id: int, agent_session_id: str) -> Session | None:
    sessions = Session.objects.filter(project_id=project_id, agent_session_id=agent_session_id)
    return sessions.order_by("pk").first()


def import_result(session: Session, *, created: bool) -> dict[str, Any]:
    """An import job's result: the session and how many turns it holds."""
    return {
        "session_id": session.pk,
        "agent_session_id": session.agent_session_id,
        "created": created,
        "turns": Run.objects.filter(session=session, source=RunSource.IMPORT).count(),
    }


# ---------------------------------------------------------------- claimed and finished by a runner


def claim_job(runner_id: str) -> int | None:
    """Take the oldest pending job, or None; safe with any number of runners."""
    if not AgentJob.objects.filter(state=AgentJobState.PENDING).exists():
        # Jobs are rare: a plain read first, so polling takes no write lock (SQLite's IMMEDIATE).
        return None
    with transaction.atomic():
        candidates = AgentJob.objects.filter(state=AgentJobState.PENDING).order_by("created_at", "id")
        if connection.vendor == "postgresql":
            candidates = candidates.select_for_update(skip_locked=True)
        job_id = candidates.values_list("pk", flat=True).first()
        if job_id is None:
            return None
        claimed = AgentJob.objects.filter(pk=job_id, state=AgentJobState.PENDING).update(
            state=AgentJobState.RUNNING, runner_id=runner_id, started_at=timezone.now()
        )
        return job_id if claimed else None


def job_context(job_id: int) -> JobContext:
    job = AgentJob.objects.select_related("project").get(pk=job_id)
    project = job.project
    return JobContext(
        job_id=job.pk,
        kind=job.kind,
        payload=job.payload,
        project_id=project.pk,
        project_name=project.name,
        cwd=project.path,
        agent=project.agent,
    )


def finish_job(
    job_id: int, *, result: dict[str, Any] | None = None, error_code: str = "", error: str = ""
) -> None:
    state = AgentJobState.FAILED if error_code else AgentJobState.DONE
    # Both quote the agent (its session titles, its errors): redacted as the journal is.
    AgentJob.objects.filter(pk=job_id, state=AgentJobState.RUNNING).update(
        state=state,
        result=redact(result or {}),
        error_code=error_code,
        error=redact_text(error),
        finished_at=timezone.now(),
    )


def reap_orphaned_jobs(reaper_id: str) -> list[int]:
    """Fail running jobs whose runner stopped heartbeating; asking again is safe."""
    alive = set(Runner.objects.alive().values_list("pk", flat=True)) | {reaper_id}
    orphaned = list(
        AgentJob.objects.filter(state=AgentJobState.RUNNING)
        .exclude(runner_id__in=alive)
        .values_list("pk", "runner_id")
    )
    reaped = []
    for job_id, runner_id in orphaned:
        updated = AgentJob.objects.filter(pk=job_id, state=AgentJobState.RUNNING, runner_id=runner_id).update(
            state=AgentJobState.FAILED,
            error_code="runner_lost",
            error=f"runner {runner_id or '?'} stopped before the job finished; ask again",
            finished_at=timezone.now(),
        )
        if updated:
            reaped.append(job_id)
    return reaped


def imported_turn_events(turn: ImportedTurn, started: RunDetails) -> list[NewEvent]:
    """The journal of one imported turn: run.started, what the agent produced, done{completed}."""
    payload: RunStarted = {"status": RunStatus.RUNNING, **started}
    return [
        NewEvent(EventType.RUN_STARTED, payload),
        *turn.events,
        done_event(RunStatus.COMPLETED, imported=True),
    ]


def write_import(
    project_id: int, agent_session_id: str, history: ImportedHistory, agent: str
) -> tuple[Session, bool]:
    """Create the session and its completed turns in one transaction; idempotent.

    Returns the session and whether it was created now. The project row lock
    serialises imports, so the same agent session is never imported twice.
    """
    with transaction.atomic():
        project = Project.objects.select_for_update().get(pk=project_id)
        existing = imported_session(project.pk, agent_session_id)
        if existing is not None:
            return existing, False
        title = history.title or _title_from(history.turns) or f"Imported {agent_session_id[:8]}"
        session = Session.objects.create(
            project=project,
            title=redact_text(title)[:300],  # the agent's words, as the live path stores them
            agent_session_id=agent_session_id,
            commands=redact(history.commands or []),
        )
        for index, turn in enumerate(history.turns, start=1):
            now = timezone.now()
            # Created running (a queued run would be claimable) and ended by its own `done`.
            run = Run.objects.create(
                session=session,
                client_id=f"import-{index}",
                prompt_text=turn.prompt,
                source=RunSource.IMPORT,
                source_meta={"agent_session_id": agent_session_id, "turn": index},
                status=RunStatus.RUNNING,
                created_at=now,
                started_at=now,
            )
            started = RunDetails(
                session_id=session.pk,
                agent=agent,
                project=project.name,
                workspace=project.path,
                source=RunSource.IMPORT,
                imported=True,
            )
            journal.append_batch(run.pk, imported_turn_events(turn, started), publish=False)
        session_id = session.pk
        notify.publish_on_commit(notify.publish_session_changed, session_id)
        search.index_session_on_commit(session_id)  # its turns settled: searchable (docs/search.md)
    return session, True


def _title_from(turns: list[ImportedTurn]) -> str:
    for turn in turns:
        words = turn.prompt.split()
        if words:
            return " ".join(words[:8])
    return ""
