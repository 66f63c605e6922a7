"""Unattended approvals (issue 42): a fired run's permission request nobody answers is denied at
its trigger's timeout — through a reject option, or the turn cancelled — and never granted.

docs/automations.md ("Unattended approvals").
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from websockets.sync.client import connect

from automations import services
from automations.models import Firing, FiringOutcome, Trigger, TriggerKind
from runs.models import Control, ControlKind, EventType, Run, RunStatus
from tests import factories
from tests.support.live import LiveSocket, LiveStack, layer, live, session_cookie  # noqa: F401
from tests.support.runs import wait_event, wait_status

OPTIONS = [
    {"option_id": "allow_once", "name": "Allow once", "kind": "allow_once"},
    {"option_id": "allow_always", "name": "Allow always", "kind": "allow_always"},
    {"option_id": "deny", "name": "Deny", "kind": "reject_once"},
]


def waiting_run(session: Any, timeout: int | None, options: list[dict[str, Any]]) -> tuple[Run, Firing]:
    trigger = Trigger.objects.create(
        workflow=factories.WorkflowFactory(project=session.project),
        kind=TriggerKind.WEBHOOK,
        approval_timeout_seconds=timeout,
    )
    run = factories.run_with_events(
        [
            ("run.started", {"status": "running"}),
            ("approval.requested", {"approval_id": "ap-1", "title": "rm -rf build", "options": options}),
        ],
        session=session,
        status=RunStatus.AWAITING_APPROVAL,
    )
    firing = Firing.objects.create(
        trigger=trigger, planned_at=timezone.now(), outcome=FiringOutcome.LAUNCHED, run=run, session=session
    )
    return run, firing


@pytest.mark.django_db
def test_a_waiting_approval_is_denied_at_the_timeout_never_before(session: Any) -> None:
    run, firing = waiting_run(session, 60, OPTIONS)
    assert services.deny_expired_approvals(timezone.now() + timedelta(seconds=30)) == 0
    assert not Control.objects.exists()

    assert services.deny_expired_approvals(timezone.now() + timedelta(seconds=61)) == 1
    control = Control.objects.get(run=run)
    assert control.kind == ControlKind.APPROVAL and control.payload == {"option_id": "deny"}
    firing.refresh_from_db()
    assert "approval ap-1 denied (deny)" in firing.reason
    # Answered once: the next pass finds it answered.
    assert services.deny_expired_approvals(timezone.now() + timedelta(seconds=120)) == 0
    assert Control.objects.count() == 1


@pytest.mark.django_db
def test_with_no_reject_option_the_turn_is_cancelled_not_granted(session: Any) -> None:
    run, _ = waiting_run(session, 5, OPTIONS[:2])
    assert services.deny_expired_approvals(timezone.now() + timedelta(seconds=6)) == 1
    kinds = list(Control.objects.filter(run=run).values_list("kind", flat=True))
    assert kinds == [ControlKind.CANCEL]


@pytest.mark.django_db
def test_without_a_timeout_or_a_firing_an_approval_waits(session: Any) -> None:
    waiting_run(session, None, OPTIONS)
    factories.run_with_events(
        [("approval.requested", {"approval_id": "ap-2", "title": "x", "options": OPTIONS})],
        session=factories.SessionFactory(project=session.project),
        status=RunStatus.AWAITING_APPROVAL,
    )
    assert services.deny_expired_approvals(timezone.now() + timedelta(days=30)) == 0
    assert not Control.objects.exists()


def user_socket(live: LiveStack, user: Any) -> LiveSocket:
    """The owner's socket on /ws/live/: every tab's feed of their sessions' states."""
    ws = connect(
        f"ws://127.0.0.1:{live.port}/ws/live/",
        origin=live.origin(),
        additional_headers={"Cookie": f"sessionid={session_cookie(user)}"},
        proxy=None,
        open_timeout=30,
    )
    return LiveSocket(live.sockets.enter_context(ws))


def state_of(frame: dict[str, Any], session_id: int | None) -> dict[str, Any] | None:
    return next((s for s in frame.get("sessions", []) if s["id"] == session_id), None)


def test_a_fired_run_waiting_for_approval_tells_its_owner_and_is_denied(
    live: LiveStack, user: Any, project: Any
) -> None:
    live.start_daphne()
    runner = live.start_runner(HERMESWEB_DEMO_DELAY="0.005")
    workflow = factories.WorkflowFactory(project=project, prompt_template="fast approve {what}")
    api = Client()
    api.force_login(user)
    created = api.post(
        f"/api/workflows/{workflow.pk}/triggers",
        {"kind": "webhook", "approval_timeout_seconds": 2},
        content_type="application/json",
    )
    assert created.status_code == 201, created.content
    socket = user_socket(live, user)
    socket.send(type="sessions")
    socket.until(lambda f: f["type"] == "sessions")

    url = "/" + created.json()["url"].split("/", 3)[-1]
    answer = Client().post(url, {"what": "the cleanup"}, content_type="application/json")
    assert answer.status_code == 202, answer.content
    run = Run.objects.get(pk=answer.json()["run_id"])

    # The owner's feed says the fired session needs them: what the sidebar's "needs you" and the
    # browser notification (static/js/notify.js) are made of.
    def waiting(frame: dict[str, Any]) -> bool:
        state = state_of(frame, run.session_id)
        return state is not None and state["run_status"] == "awaiting_approval"

    socket.until(waiting, 60)
    resolved = wait_event(run, EventType.APPROVAL_RESOLVED, timeout=60)
    assert resolved.payload["option_id"] == "deny"
    wait_status(run, RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, timeout=60, log=runner.log)
    assert not Control.objects.filter(run=run, payload__option_id__startswith="allow").exists()
    assert "denied (deny)" in Firing.objects.get(pk=answer.json()["firing_id"]).reason
