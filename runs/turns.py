"""The end of a turn: its terminal event, and the session handed on (docs/intents.md).

Every way a run ends comes through `finish_run` — the runner's final write, a cancel
before start, a reaper or an operator interrupting it — so the queue drains exactly
once, in the transaction that records the terminal `done`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.utils import timezone

from intents import services as intents
from projects.models import Session
from runs import journal, notify, search
from runs.journal import NewEvent
from runs.journal.payloads import Error
from runs.models import Control, ControlState, EventType, JournalEvent, Run, RunStatus
from runs.redaction import redact_text


def finish_run(run_id: int, events: Sequence[NewEvent], **run_updates: Any) -> list[JournalEvent]:
    """Append a run's final events (ending with `done`) and hand the session on.

    In the same transaction as the terminal event: leftover steers become queued
    items (settle), controls the run never applied are answered, and the next
    waiting intent drains into a new run (drain), so the queue drains exactly once
    whatever crashes afterwards. Raises journal.AlreadyTerminal if the run has ended.
    """
    session_id = Run.objects.values_list("session_id", flat=True).get(pk=run_id)
    if run_updates.get("error"):
        # Error text quotes the agent (its stderr, its exceptions): no secret on the Run row.
        run_updates["error"] = redact_text(run_updates["error"])
    with transaction.atomic():
        # Lock order everywhere: session, then run (append_batch locks the run).
        session = Session.objects.lock(session_id)
        rows = journal.append_batch(run_id, events, **run_updates)
        run = Run.objects.get(pk=run_id)
        intents.settle_after_run(session, run)
        # Whatever the run never got to apply is answered now, so nothing stays pending forever.
        Control.objects.filter(run_id=run_id, state=ControlState.PENDING).update(
            state=ControlState.REJECTED,
            result="expired",
            message="the run ended first",
            applied_at=timezone.now(),
        )
        next_run = intents.drain(session)
        if next_run is not None:
            notify.wake_runners("run.queued", next_run.pk)
        notify.publish_on_commit(notify.publish_session_changed, session.pk)
        # Last, after every notification: the run's search document (docs/search.md).
        search.index_on_commit(run_id)
    return rows


def after_unanswered_finish(run_id: int, session_id: int) -> None:
    """What finish_run's commit does after it, for a commit whose answer never arrived.

    The runner's writer found its final write had landed (runs/runner/writer.py, "exactly
    once"): the commit's callbacks never ran, so the session's viewers and the search index
    hear of the run's end here. Its events are the writer's to publish.
    """
    notify.publish_session_changed(session_id)
    search.index_on_commit(run_id)


def do_mark_interrupted(run: Run, reason: str, *, code: str = "interrupted") -> bool:
    """Give an executing run whose runner is gone its terminal event. Never re-prompts it.

    Returns False when the run already ended (someone else got there first).
    """
    try:
        finish_run(
            run.pk,
            [
                NewEvent(EventType.ERROR, Error(code=code, message=reason, terminal=True)),
                journal.done_event(RunStatus.INTERRUPTED, reason=reason, code=code),
            ],
            error=reason,
        )
    except journal.AlreadyTerminal:
        return False
    return True
