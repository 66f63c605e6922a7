"""Helpers for the pending-intent tests (docs/intents.md): real runners, the API's view of a session.

"Refresh", "reconnect" and "session switch" are browser words; at the server
they mean one thing: read the session's intents and transcript again from the
API. `view` does that, so a test can compare what a reloaded tab would draw.
Import the fixtures into a test module with
`from tests.support.intents import runner  # noqa: F401` (`logs` and `runners` come from conftest).
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.test import Client

from intents.models import PendingIntent
from projects.models import Session
from runs.models import JournalEvent, Run, RunStatus
from runs.services import SubmitResult, do_submit_message
from runs.transcript import apply_event, materialize
from tests.support.procs import Proc, start_runner, wait_for
from tests.support.runs import wait_event

FAST_DEMO = "0.005"


@pytest.fixture
def runner(runners: list[Proc], logs: Path) -> Proc:
    proc = start_runner(logs, f"r-{uuid.uuid4().hex[:6]}", HERMESWEB_DEMO_DELAY=FAST_DEMO)
    runners.append(proc)
    return proc


def spawn_runner(runners: list[Proc], logs: Path, name: str, **env: str) -> Proc:
    proc = start_runner(logs, name, **{"HERMESWEB_DEMO_DELAY": FAST_DEMO, **env})
    runners.append(proc)
    return proc


def pause(proc: Proc, session: Session) -> None:
    """Freeze a runner (SIGSTOP) outside any write of its own, so what it has not applied stays pending.

    A runner frozen inside a transaction would hold the session's or run's
    lock (SQLite: the database's) until it is continued, and the test's own
    writes would wait on it; then it is continued and frozen again.
    """

    def frozen_outside_a_write() -> bool:
        proc.signal(signal.SIGSTOP)
        # kill() returns before every thread has stopped: one still running on the other
        # core could take the write lock just after the probe below found it free.
        wait_for(lambda: _all_threads_stopped(proc.pid), 5, what=f"{proc.name}'s threads to stop")
        if _can_write(session):
            return True
        proc.signal(signal.SIGCONT)
        return False

    wait_for(frozen_outside_a_write, 10, what=f"{proc.name} to pause outside a transaction")


def resume(proc: Proc) -> None:
    proc.signal(signal.SIGCONT)


def _all_threads_stopped(pid: int) -> bool:
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            state = stat.read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # a thread that just exited
        if state not in ("T", "t"):
            return False
    return True


def _can_write(session: Session) -> bool:
    if connection.vendor == "sqlite":
        probe = sqlite3.connect(connection.settings_dict["NAME"], timeout=0)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            probe.close()
    try:
        with transaction.atomic():
            list(Session.objects.select_for_update(nowait=True).filter(pk=session.pk).values_list("pk"))
            list(
                Run.objects.filter(session=session).active().select_for_update(nowait=True).values_list("pk")
            )
            return True
    except DatabaseError:
        return False


def demo_agent_env(**overrides: Any) -> str:
    """HERMESWEB_AGENTS for a runner whose `demo` agent differs from the web process's (e.g. steer)."""
    spec = dataclasses.asdict(settings.HERMESWEB_AGENTS["demo"])
    spec.pop("name")
    spec["env"] = {**spec["env"], "HERMESWEB_DEMO_DELAY": FAST_DEMO}
    spec.update(overrides)
    return json.dumps({"demo": spec})


# ---------------------------------------------------------------- submitting


def send(session: Session, text: str, mode: str = "auto") -> SubmitResult:
    return do_submit_message(session, client_id=uuid.uuid4().hex, text=text, mode=mode)


def queue(session: Session, text: str) -> PendingIntent:
    result = send(session, text, mode="queue")
    assert result.kind == "queue" and result.intent is not None, result
    return result.intent


def start_turn(session: Session, text: str, *, started: str = "tool.started") -> Run:
    """A new turn, returned once the agent is inside it (`started` is journaled)."""
    result = send(session, text)
    assert result.run is not None, result
    wait_event(result.run, started)
    return result.run


def fresh(intent: PendingIntent) -> PendingIntent:
    return PendingIntent.objects.get(pk=intent.pk)


def wait_intent(intent: PendingIntent, timeout: float = 30.0, **fields: Any) -> PendingIntent:
    def check() -> PendingIntent | None:
        row = fresh(intent)
        return row if all(getattr(row, k) == v for k, v in fields.items()) else None

    return wait_for(check, timeout, what=f"intent {intent.pk} to have {fields} (is {fresh(intent).__dict__})")


def run_from(intent: PendingIntent, timeout: float = 30.0) -> Run:
    """The turn an intent became."""
    return wait_for(
        lambda: Run.objects.filter(pk=fresh(intent).run_id).first(),
        timeout,
        what=f"intent {intent.pk}'s turn",
    )


def settled(session: Session, timeout: float = 60.0) -> None:
    """Wait until the session has no active run and nothing left to drain."""

    def idle() -> bool:
        return (
            not Run.objects.filter(session=session).active().exists()
            and not PendingIntent.objects.filter(session=session).open().exists()
        )

    wait_for(idle, timeout, what=f"session {session.pk} to settle")


# ---------------------------------------------------------------- what a tab sees


def view(api: Client, session: Session) -> dict[str, Any]:
    """What a tab draws after a refresh: the transcript (turns + open intents) and the intent list."""
    transcript = api.get(f"/api/sessions/{session.pk}/transcript")
    intents = api.get(f"/api/sessions/{session.pk}/intents")
    assert transcript.status_code == 200, transcript.content
    assert intents.status_code == 200, intents.content
    body = transcript.json()
    assert [i["id"] for i in body["intents"]] == [i["id"] for i in intents.json()["intents"]]
    return body


def turn_of(body: dict[str, Any], run: Run) -> dict[str, Any]:
    return next(t for t in body["turns"] if t["run_id"] == run.pk)


def steer_items(turn: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in turn["state"]["items"] if item["kind"] == "steer"]


def replay(api: Client, run: Run, limit: int = 4, overlap: int = 2) -> dict[str, Any]:
    """Fold a finished run's journal as a reconnecting client would: small, overlapping pages.

    Every page after the first starts `overlap` events before what was already
    applied, as a client resuming from a stale Last-Event-ID does.
    """
    state = materialize([])
    while True:
        before = state["last_seq"]
        after = max(0, before - overlap)
        page = api.get(f"/api/runs/{run.pk}/events", {"after_seq": after, "limit": limit}).json()
        for event in page["events"]:
            apply_event(state, event)
        if page["terminal"] and state["last_seq"] == page["last_seq"]:
            return as_json(state)
        assert state["last_seq"] > before, f"run {run.pk} has not finished; replay it once it has"


def as_json(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def open_ids(body: dict[str, Any]) -> list[int]:
    return [intent["id"] for intent in body["intents"]]


def switch_away_and_back(api: Client, session: Session, other: Session) -> tuple[dict, dict, dict]:
    """Read the session, then another one, then the session again (a tab switching sessions)."""
    before = view(api, session)
    elsewhere = view(api, other)
    after = view(api, session)
    return before, elsewhere, after


def runs_of(session: Session) -> list[Run]:
    return list(Run.objects.filter(session=session).order_by("created_at", "id"))


def steer_rows(run: Run) -> list[JournalEvent]:
    return list(JournalEvent.objects.filter(run=run, type="steer.delivered").order_by("seq"))


def terminal_state(run: Run) -> str:
    run.refresh_from_db()
    assert run.status in (RunStatus.COMPLETED, RunStatus.CANCELLED, RunStatus.FAILED, RunStatus.INTERRUPTED)
    return run.status
