"""A session's mode and model: shown and chosen over the API, applied by the runner before a turn.

The API tests use the database only; the runner tests drive real `manage.py runner`
processes on the bundled demo agent, which reports two modes (`default`, `accept_edits`:
edits without asking) and two models, takes any model id but `missing-*`, and answers
`/status` with its current mode and model. Real Hermes: tests/test_hermes_modes_models.py.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from projects.models import Session
from projects.services import do_update_session
from runs.models import RunStatus
from tests import factories
from tests.support.procs import Proc, start_runner
from tests.support.runs import events, run_of, state, submit, types, wait_status

JSON = "application/json"
MODES = [
    {"id": "default", "name": "Default", "description": "Ask before edits."},
    {"id": "accept_edits", "name": "Accept edits", "description": "Write files without asking."},
]
MODELS = [{"id": "custom:mock-model", "name": "mock-model"}]


def patch(api: Client, session: Any, **body: Any) -> Any:
    return api.patch(f"/api/sessions/{session.pk}", body, content_type=JSON)


# ---------------------------------------------------------------- API


@pytest.mark.django_db
def test_a_session_shows_empty_modes_and_models_until_the_agent_reports_some(
    api: Client, session: Any
) -> None:
    body = api.get(f"/api/sessions/{session.pk}").json()
    assert (body["modes"], body["models"], body["mode"], body["model"]) == ([], [], "", "")


@pytest.mark.django_db
def test_a_session_shows_the_modes_and_models_the_agent_reported(api: Client, session: Any) -> None:
    Session.objects.filter(pk=session.pk).update(
        available_modes=MODES, available_models=[{"id": "custom:mock-model", "name": "mock-model"}]
    )
    body = api.get(f"/api/sessions/{session.pk}").json()
    assert body["modes"] == MODES
    assert body["models"] == MODELS
    listed = api.get(f"/api/projects/{session.project_id}/sessions").json()
    assert listed[0]["modes"] == MODES and listed[0]["models"] == MODELS


@pytest.mark.django_db
def test_patching_a_reported_mode_chooses_it(api: Client, session: Any) -> None:
    Session.objects.filter(pk=session.pk).update(available_modes=MODES)
    response = patch(api, session, mode="accept_edits")
    assert response.status_code == 200, response.content
    assert response.json()["mode"] == "accept_edits"
    session.refresh_from_db()
    assert session.mode == "accept_edits"
    assert patch(api, session, mode="").json()["mode"] == ""  # "" clears the choice


@pytest.mark.django_db
def test_a_mode_the_agent_did_not_report_is_refused(api: Client, session: Any) -> None:
    Session.objects.filter(pk=session.pk).update(available_modes=MODES)
    response = patch(api, session, mode="yolo")
    assert response.status_code == 422
    assert response.json()["code"] == "unknown_mode"
    session.refresh_from_db()
    assert session.mode == ""


@pytest.mark.django_db
def test_a_mode_is_refused_before_the_agent_reported_any(api: Client, session: Any) -> None:
    response = patch(api, session, mode="accept_edits")
    assert response.status_code == 422
    assert response.json()["code"] == "unknown_mode"


@pytest.mark.django_db
def test_any_model_id_may_be_chosen_within_its_length(api: Client, session: Any) -> None:
    response = patch(api, session, model="mock-model-b")
    assert response.status_code == 200, response.content
    assert response.json()["model"] == "mock-model-b"
    assert patch(api, session, model="m" * 201).status_code == 422
    assert patch(api, session, model="bad\nid").json()["code"] == "invalid_model"
    session.refresh_from_db()
    assert session.model == "mock-model-b"


@pytest.mark.django_db
def test_another_users_session_cannot_be_patched(api: Client, other_user: Any) -> None:
    theirs = factories.SessionFactory(project__owner=other_user, available_modes=MODES)
    response = patch(api, theirs, mode="accept_edits")
    assert response.status_code == 404
    assert patch(api, theirs, model="x").status_code == 404
    theirs.refresh_from_db()
    assert (theirs.mode, theirs.model) == ("", "")


@pytest.mark.django_db
def test_launching_a_workflow_in_a_session_gives_it_the_workflows_mode_and_model(
    api: Client, session: Any
) -> None:
    Session.objects.filter(pk=session.pk).update(available_modes=MODES)
    workflow = factories.WorkflowFactory(
        project=session.project, prompt_template="go", agent_mode="accept_edits", agent_model="big"
    )
    response = api.post(f"/api/workflows/{workflow.pk}/launch", {"session_id": session.pk}, content_type=JSON)
    assert response.status_code == 202, response.content
    session.refresh_from_db()
    assert (session.mode, session.model) == ("accept_edits", "big")

    other = factories.WorkflowFactory(project=session.project, prompt_template="go", agent_mode="yolo")
    refused = api.post(f"/api/workflows/{other.pk}/launch", {"session_id": session.pk}, content_type=JSON)
    assert refused.status_code == 422
    assert refused.json()["code"] == "unknown_mode"


# ---------------------------------------------------------------- runner, demo agent


@pytest.fixture
def runner(runners: list[Proc], logs: Path) -> Proc:
    proc = start_runner(logs, "r1", HERMESWEB_DEMO_DELAY="0.005")
    runners.append(proc)
    return proc


@pytest.fixture
def demo_session(db: None) -> Any:
    return factories.SessionFactory(project__agent="demo")


def started(run: Any) -> dict[str, Any]:
    return next(e.payload for e in events(run) if e.type == "run.started")


def turn(session: Any, text: str, runner: Proc, status: str = RunStatus.COMPLETED) -> Any:
    run = run_of(submit(session, text))
    return wait_status(run, status, log=runner.log)


def error_of(run: Any) -> dict[str, Any]:
    return next(e.payload for e in events(run) if e.type == "error")


@pytest.mark.django_db(transaction=True)
def test_the_runner_stores_the_modes_and_models_the_agent_reports(runner: Proc, demo_session: Any) -> None:
    turn(demo_session, "fast hello", runner)
    demo_session.refresh_from_db()
    assert [m["id"] for m in demo_session.available_modes] == ["default", "accept_edits"]
    assert demo_session.available_modes[1]["description"] == "Write files without asking."
    assert demo_session.available_models == [
        {"id": "demo-small", "name": "Demo small"},
        {"id": "demo-large", "name": "Demo large"},
    ]
    # No choice was made: the agent's current ones are the session's.
    assert (demo_session.mode, demo_session.model) == ("default", "demo-small")


@pytest.mark.django_db(transaction=True)
def test_a_chosen_mode_reaches_the_agent_before_the_next_turn(runner: Proc, demo_session: Any) -> None:
    turn(demo_session, "fast hello", runner)
    demo_session.refresh_from_db()
    do_update_session(demo_session, mode="accept_edits")
    run = turn(demo_session, "edit fast", runner)
    assert "approval.requested" not in types(run)  # accept_edits: the demo writes without asking
    assert started(run)["mode"] == "accept_edits"
    assert "Mode: accept_edits" in state(turn(demo_session, "/status", runner))["text"]


@pytest.mark.django_db(transaction=True)
def test_a_chosen_model_reaches_the_agent_and_shows_on_run_started(runner: Proc, demo_session: Any) -> None:
    turn(demo_session, "fast hello", runner)
    demo_session.refresh_from_db()
    do_update_session(demo_session, model="demo-large")
    run = turn(demo_session, "/status", runner)
    assert "model: demo-large" in state(run)["text"]
    assert started(run)["model"] == "demo-large"


@pytest.mark.django_db(transaction=True)
def test_a_model_the_agent_refuses_fails_the_turn_with_model_refused(runner: Proc, demo_session: Any) -> None:
    turn(demo_session, "fast hello", runner)
    demo_session.refresh_from_db()
    do_update_session(demo_session, model="missing-model")
    failed = turn(demo_session, "fast again", runner, RunStatus.FAILED)
    error = error_of(failed)
    assert error["code"] == "model_refused"
    assert "missing-model" in error["message"]
    assert "token.delta" not in types(failed)  # the prompt was never sent
    # Bounded: choosing a model it serves makes the session usable again.
    do_update_session(demo_session, model="demo-large")
    assert "model: demo-large" in state(turn(demo_session, "/status", runner))["text"]


@pytest.mark.django_db(transaction=True)
def test_a_chosen_mode_survives_a_fresh_agent_process(
    runners: list[Proc], logs: Path, demo_session: Any
) -> None:
    first = start_runner(logs, "r1", HERMESWEB_DEMO_DELAY="0.005")
    runners.append(first)
    turn(demo_session, "fast hello", first)
    demo_session.refresh_from_db()
    do_update_session(demo_session, mode="accept_edits", model="demo-large")
    first.stop()
    second = start_runner(logs, "r2", HERMESWEB_DEMO_DELAY="0.005")
    runners.append(second)
    text = state(turn(demo_session, "/status", second))["text"]
    assert "Mode: accept_edits · model: demo-large" in text


@pytest.mark.django_db(transaction=True)
def test_a_mode_the_agent_switches_to_itself_becomes_the_sessions(runner: Proc, demo_session: Any) -> None:
    turn(demo_session, "fast hello", runner)
    switched = turn(demo_session, "/mode accept_edits", runner)  # current_mode_update from the agent
    progress = [e.payload["text"] for e in events(switched) if e.type == "progress"]
    assert "The agent switched to mode accept_edits." in progress
    demo_session.refresh_from_db()
    assert demo_session.mode == "accept_edits"
    run = turn(demo_session, "edit fast", runner)
    assert "approval.requested" not in types(run)
    assert started(run)["mode"] == "accept_edits"


@pytest.mark.django_db(transaction=True)
def test_a_workflow_launches_a_session_in_its_mode_and_model(runner: Proc, db: None) -> None:
    from runs.services import do_launch_workflow

    workflow = factories.WorkflowFactory(
        project__agent="demo", prompt_template="/status", agent_mode="accept_edits", agent_model="demo-large"
    )
    result = do_launch_workflow(workflow, session=None, variables={}, client_id=uuid.uuid4().hex)
    run = wait_status(run_of(result), RunStatus.COMPLETED, log=runner.log)
    assert "Mode: accept_edits · model: demo-large" in state(run)["text"]
    assert (started(run)["mode"], started(run)["model"]) == ("accept_edits", "demo-large")
