"""Fork a session: a new session in the same project that starts with the parent's history.

Design note: docs/agents.md ("Fork"). The web side copies the parent's settled turns (runs
and their journal) the way session import writes history (`source: import`, appended
unpublished, indexed for search on commit); the agent side is forked lazily: the new session
holds the parent's ACP session id in `fork_agent_session_id` and its first turn asks the
agent for `session/fork` (runs/runner/forking.py).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from projects.models import ProjectStatus, Session, SessionStatus
from projects.refusals import Refused
from projects.services import hold_session_room
from runs import journal, notify, search
from runs.journal import NewEvent, done_event
from runs.models import TERMINAL_STATUSES, JournalEvent, Run, Runner, RunSource, RunStatus

FORK_SUFFIX = " (fork)"
TITLE_MAX = 300


class ForkRefused(Refused):
    """A fork the session's state or its agent does not allow; `status` is the HTTP answer."""


def agent_can_fork(agent: str) -> bool | None:
    """Whether `agent` advertises `session/fork`, as alive runners last saw it; None if none has.

    Runners report each agent's `initialize` summary in their heartbeat once they have started
    it (runs/runner/agents.py, `_summarise`); any of them saying so is enough.
    """
    known = False
    for caps in Runner.objects.alive().values_list("agent_capabilities", flat=True):
        summary = (caps or {}).get(agent)
        if not isinstance(summary, dict):
            continue
        known = True
        if "fork" in (summary.get("session_capabilities") or {}):
            return True
    return False if known else None


def do_fork_session(user: Any, session_id: int) -> Session:
    """Fork `session_id` (visible to `user`) into a new session holding its settled turns.

    Preconditions, in order: visible (else Session.DoesNotExist), project and session not
    archived (409 `project_archived` / `session_archived`), no turn queued or running (409
    `session_busy`: a fork is of a settled conversation), an agent session to fork (422
    `unsupported`), and the agent advertising `session/fork` (422 `unsupported`; 422
    `agent_unavailable` when no alive runner has started that agent yet to say).
    Not idempotent: each call makes a new fork (the browser sends one per click).
    """
    with transaction.atomic():
        parent = Session.objects.lock(session_id, visible_to=user)
        project = parent.project
        if project.status == ProjectStatus.ARCHIVED:
            raise ForkRefused(409, "project_archived", "This project is archived; restore it to fork.")
        if parent.status == SessionStatus.ARCHIVED:
            raise ForkRefused(409, "session_archived", "This session is archived; unarchive it to fork.")
        if parent.runs.active().exists():  # type: ignore[attr-defined]
            raise ForkRefused(409, "session_busy", "A turn is running; fork when it has ended.")
        # A fork that has not run yet forks what it would have forked.
        source = parent.agent_session_id or parent.fork_agent_session_id
        if not source:
            raise ForkRefused(
                422, "unsupported", "This session has not talked to its agent yet: there is nothing to fork."
            )
        can_fork = agent_can_fork(project.agent)
        if can_fork is None:
            raise ForkRefused(
                422,
                "agent_unavailable",
                f"No runner has started agent {project.agent!r} yet to tell whether it can fork; try again.",
            )
        if not can_fork:
            raise ForkRefused(422, "unsupported", f"Agent {project.agent!r} does not support session/fork.")
        hold_session_room(project.owner_id)  # Conflict `too_many_sessions`: a 409 at the API root
        fork = Session.objects.create(
            project=project,
            title=_fork_title(parent),
            model=parent.model,
            mode=parent.mode,
            commands=parent.commands,
            available_modes=parent.available_modes,
            available_models=parent.available_models,
            # The user's config choices carry over; the agent's fork answer refreshes the options.
            config_options=parent.config_options,
            config=parent.config,
            forked_from=parent,
            fork_agent_session_id=source,
        )
        settled = Run.objects.filter(session=parent, status__in=TERMINAL_STATUSES)
        for run in settled.order_by("created_at", "id"):
            _copy_run(run, fork)
        fork_id = fork.pk
        notify.publish_on_commit(notify.publish_session_changed, fork_id)
        search.index_session_on_commit(fork_id)  # its copied turns are settled: searchable
    return fork


def _fork_title(parent: Session) -> str:
    base = parent.title or f"Session {parent.pk}"
    return base[: TITLE_MAX - len(FORK_SUFFIX)] + FORK_SUFFIX


def _copy_run(run: Run, fork: Session) -> Run:
    """One settled turn of the parent, copied as import turns are written (runs/discovery.py).

    Created running and ended by its own copied `done`, in the caller's transaction. The events
    keep their order, types and payloads, so their seqs are the parent's (1..N) unless the
    parent run was compacted (then 1..M, the same transcript).
    """
    now = timezone.now()
    # A rewind or restore stays what it is (no prompt, not a turn: docs/workspace.md).
    workspace = run.source == RunSource.WORKSPACE
    copy = Run.objects.create(
        session=fork,
        client_id=f"fork-{run.pk}",
        prompt_text=run.prompt_text,
        attachments=run.attachments,
        source=RunSource.WORKSPACE if workspace else RunSource.IMPORT,
        source_meta={
            **(run.source_meta if workspace else {}),
            "forked_from_run": run.pk,
            "forked_from_session": run.session_id,
        },
        status=RunStatus.RUNNING,
        created_at=now,
        started_at=now,
    )
    events = [
        NewEvent(event.type, event.payload)
        for event in JournalEvent.objects.filter(run=run).order_by("seq").only("type", "payload")
    ]
    if not events or not events[-1].terminal:  # never expected of a settled run; end it anyway
        events.append(done_event(run.status, forked=True))
    # Without the agent's running total: the forked agent session counts from zero.
    usage = {k: v for k, v in (run.usage or {}).items() if k != "session_total"}
    journal.append_batch(
        copy.pk, events, publish=False, stop_reason=run.stop_reason, error=run.error, usage=usage
    )
    return copy
