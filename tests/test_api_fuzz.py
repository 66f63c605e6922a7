"""Schemathesis over the API's own OpenAPI document (issue 23, "Fuzzing the API").

Every operation in `/api/openapi.json` is called in-process (Django's WSGI handler, no server)
with a personal token, on generated valid and invalid inputs (schemathesis' coverage phase plus
`EXAMPLES` random ones per operation): no answer is a 5xx, and every answer's status, content
type and body are the ones the document declares. Generated ids of the right type are swapped
for the test's own objects, and each operation also runs once on a request that must succeed, so
the happy paths are checked against the document too, not only 404s. Derandomized, so a failure
reproduces; `HERMESWEB_FUZZ_EXAMPLES` raises the cap for a longer hunt outside CI. No runner
runs here: submitted turns only queue.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import hypothesis
import orjson
import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.test import Client
from hypothesis import strategies as st

from automations.services import do_create_trigger
from hermesweb.api import api as ninja_api
from intents.models import IntentState, PendingIntent
from runs import attachments
from runs.models import AgentJob, AgentJobKind, Run, RunStatus
from tests.factories import (
    ApiToken,
    PendingIntentFactory,
    ProjectFactory,
    RunnerFactory,
    SessionFactory,
    UserFactory,
    WorkflowFactory,
    run_with_events,
)
from tests.support.api_objects import COLLECTIONS  # which object a path's `{id}` names
from tests.support.worktrees import made, make_repo
from workspace.services import record_checkpoint, store_of
from worktrees.services import do_create_worktree_session

# PostgreSQL only (bin/test's second pass): production's database, the stricter about what it
# stores (NUL, integer ranges), and one pass keeps CI's time; SQLite's edges are in
# test_api_errors.py and test_unicode_inputs.py, which run in both passes.
pytestmark = [pytest.mark.django_db, pytest.mark.postgres, pytest.mark.timeout(120)]

EXAMPLES = int(os.environ.get("HERMESWEB_FUZZ_EXAMPLES", "4"))


# The document the app serves (a test below holds the two equal), loaded without a request so
# the operations are known when pytest collects.
def served_document() -> dict[str, Any]:
    """The OpenAPI document as JSON has it (status codes are strings there)."""
    document = ninja_api.get_openapi_schema(path_prefix="/api")
    return orjson.loads(orjson.dumps(document, option=orjson.OPT_NON_STR_KEYS))


schema = schemathesis.openapi.from_dict(served_document())
schema.app = get_wsgi_application()
# The token is the test's: generated (and deliberately invalid) credentials would only be replaced.
schema.config.generation.update(with_security_parameters=False)
# A body past the route's allowance is refused whole (413) before any field is looked at.
rejection = schema.config.checks.negative_data_rejection
rejection.expected_statuses = [*rejection.expected_statuses, "413"]


# Filled per test by the `objects` fixture; the hook reads it while examples are drawn.
REAL_IDS: dict[str, int] = {}
REAL_AGENT_IDS = {"approval_id": "a1", "clarify_id": "q1"}
# Answers by class (2 for 2xx …), over the module: the figure docs/reliability.md reports.
TRIED: dict[int, int] = {}


@schema.hook
def flatmap_path_parameters(context: Any, path_parameters: dict[str, Any] | None) -> Any:
    """Generated examples address the test's real objects, so the happy paths run too.

    Only a value of the declared type is replaced, so an example meant to be invalid stays so;
    the coverage phase's examples (0, negative, past a bigint, not a number) keep their ids.
    """
    if not path_parameters:
        return st.just(path_parameters)
    kind = COLLECTIONS.get(context.operation.path.split("/")[2])
    real = dict(path_parameters)
    value = real.get("id")
    if kind in REAL_IDS and isinstance(value, int) and not isinstance(value, bool):
        real["id"] = REAL_IDS[kind]
    for name, known in REAL_AGENT_IDS.items():
        value = real.get(name)
        if isinstance(value, str) and 1 <= len(value) <= 200 and "\x00" not in value:
            real[name] = known
    return st.just(real)


@pytest.fixture(scope="module", autouse=True)
def figures() -> Iterator[None]:
    """The module's figures on a FIGURE line (`-rP` shows it), for docs/reliability.md."""
    yield
    print(
        f"FIGURE api fuzz: {len(LABELS)} operations, {sum(TRIED.values())} requests checked, "
        f"by class {dict(sorted(TRIED.items()))} (5xx: {TRIED.get(5, 0)})"
    )


@pytest.fixture(autouse=True)
def connection_kept_across_requests() -> Iterator[None]:
    """The WSGI handler closes the database connection after each request, and with it the test's
    transaction; Django's test client keeps it the same way."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def token(db: None) -> str:
    user = UserFactory(username="fuzzer")
    _, raw = ApiToken.issue(user, name="fuzz")
    return raw


@pytest.fixture
def objects(token: str) -> dict[str, int]:
    """One of each object the paths name: a run awaiting an approval and a clarification, its
    waiting intent, a finished run, a job, an upload, and an idle project and session that may be deleted or
    forked (a runner says the demo agent forks)."""
    user = ApiToken.objects.get(name="fuzz").user
    workflow = WorkflowFactory(project__owner=user, prompt_template="Do {thing}")
    project = workflow.project
    run = run_with_events(
        [
            ("run.started", {"status": "running"}),
            ("approval.requested", {"approval_id": "a1", "options": [{"option_id": "allow"}]}),
            ("clarify.requested", {"clarify_id": "q1", "question": "?"}),
        ],
        session__project=project,
        status=RunStatus.AWAITING_APPROVAL,
    )
    intent = PendingIntentFactory(session=run.session)
    finished = run_with_events(
        [("token.delta", {"message_id": "m", "delta": "Done."}), ("done", {"state": "completed"})],
        session__project=project,
        status=RunStatus.RUNNING,
    )
    Run.objects.filter(pk=finished.pk).update(status=RunStatus.COMPLETED)
    job = AgentJob.objects.create(project=project, requested_by=user, kind=AgentJobKind.LIST_SESSIONS)
    idle = SessionFactory(project__owner=user, agent_session_id="agent-1")
    upload = attachments.Upload("notes.txt", [b"plain text"], 10)
    attachment = attachments.do_upload_attachment(user, idle.pk, upload)
    RunnerFactory(agent_capabilities={"demo": {"session_capabilities": {"fork": {}}}})
    # The workspace's objects: a file, and the finished run's start checkpoint of the tree as it is.
    (Path(project.path) / "notes.txt").write_text("notes\n")
    checkpoint = record_checkpoint(
        run_id=finished.pk,
        session_id=finished.session_id,
        project_id=project.pk,
        kind="start",
        snapshot=store_of(project).snapshot(),
    )
    schedule = do_create_trigger(workflow, kind="schedule", cron="0 7 * * 1-5", timezone_name="UTC").trigger
    webhook = do_create_trigger(workflow, kind="webhook", variables={"thing": "it"})
    # Two sessions in worktrees of a git project (docs/worktrees.md): one to merge, one to discard.
    git_project = ProjectFactory(owner=user)
    make_repo(git_project.path)
    (Path(git_project.path) / "fuzz.txt").write_text("fuzz\n")
    in_worktree = [do_create_worktree_session(git_project, title="", branch="", base="") for _ in "md"]
    for worktree_session in in_worktree:
        made(worktree_session.pk)
    ids = {
        "project": project.pk,
        "workflow": workflow.pk,
        "session": run.session_id,
        "run": run.pk,
        "finished_run": finished.pk,
        "intent": intent.pk,
        "intent_version": intent.version,
        "job": job.pk,
        "attachment": attachment.pk,
        "idle_project": idle.project_id,
        "idle_session": idle.pk,
        "finished_session": finished.session_id,
        "checkpoint": checkpoint,
        "trigger": schedule.pk,
        "webhook": webhook.trigger.pk,
        "secret": webhook.secret,  # type: ignore[dict-item]
        "merge_session": in_worktree[0].pk,
        "discard_session": in_worktree[1].pk,
        "git_project": git_project.pk,  # with fuzz.txt to commit (the files panel's git commit)
    }
    REAL_IDS.clear()
    REAL_IDS.update({kind: pk for kind, pk in ids.items() if kind in COLLECTIONS.values()})
    return ids


@schema.parametrize()
@hypothesis.settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(hypothesis.HealthCheck),
)
def test_every_operation_answers_as_documented_and_never_5xx(
    case: schemathesis.Case, token: str, objects: dict[str, int]
) -> None:
    # Not `positive_data_acceptance`: input the schema allows may still be refused by a rule
    # the schema cannot say (a path outside the allowed roots, an unknown agent), with a 4xx.
    response = case.call_and_validate(
        headers={"Authorization": f"Bearer {token}"},
        excluded_checks=[schemathesis.checks.positive_data_acceptance],
    )
    TRIED[response.status_code // 100] = TRIED.get(response.status_code // 100, 0) + 1


class Happy(NamedTuple):
    """A request that succeeds: path parameters, query and body, by the `objects` they name."""

    path: dict[str, Any]
    query: dict[str, Any] | None = None
    body: Any = None
    media_type: str = "application/json"
    headers: dict[str, str] | None = None


def happy_requests(o: dict[str, int], allowed_root: Path) -> dict[str, Happy]:
    """A successful call of every operation (a new one must add its own: a test checks)."""
    run, session, project = {"id": o["run"]}, {"id": o["session"]}, {"id": o["project"]}
    idle = {"id": o["idle_session"]}
    intent = {"id": o["intent"]}
    new_dir = allowed_root / "new"
    new_dir.mkdir(exist_ok=True)
    return {
        "GET /api/health": Happy({}),
        "GET /api/agents": Happy({}),
        "GET /api/projects": Happy({}, {"include_archived": True}),
        "POST /api/projects": Happy({}, body={"name": "New ‮ project", "path": str(new_dir)}),
        "GET /api/projects/{id}": Happy(project),
        "PATCH /api/projects/{id}": Happy(project, body={"name": "Renamed", "running_default": "steer"}),
        "DELETE /api/projects/{id}": Happy({"id": o["idle_project"]}),
        "GET /api/projects/{id}/workflows": Happy(project),
        "POST /api/projects/{id}/workflows": Happy(project, body={"name": "W", "prompt_template": "Hi {x}"}),
        "GET /api/workflows/{id}": Happy({"id": o["workflow"]}),
        "PATCH /api/workflows/{id}": Happy({"id": o["workflow"]}, body={"description": "d"}),
        "DELETE /api/workflows/{id}": Happy({"id": o["workflow"]}),
        "POST /api/workflows/{id}/launch": Happy({"id": o["workflow"]}, body={"variables": {"thing": "it"}}),
        "GET /api/projects/{id}/sessions": Happy(project, {"status": "active"}),
        "POST /api/projects/{id}/sessions": Happy(project, body={"title": "t"}),
        "GET /api/sessions/{id}": Happy(session),
        "PATCH /api/sessions/{id}": Happy(session, body={"title": "renamed", "model": "m"}),
        "DELETE /api/sessions/{id}": Happy(idle),
        "POST /api/sessions/{id}/messages": Happy(session, body={"client_id": "c1", "text": "next"}),
        "POST /api/sessions/{id}/fork": Happy(idle),
        "POST /api/sessions/{id}/warm": Happy(session),
        "POST /api/sessions/{id}/worktree/merge": Happy(
            {"id": o["merge_session"]}, body={"strategy": "squash", "message": "m", "client_id": "c1"}
        ),
        "DELETE /api/sessions/{id}/worktree": Happy({"id": o["discard_session"]}, {"delete_branch": True}),
        "GET /api/sessions/{id}/transcript": Happy(session, {"limit": 5}),
        "GET /api/runs/{id}": Happy(run),
        "GET /api/runs/{id}/events": Happy(run, {"after_seq": 1, "limit": 10}),
        "GET /api/runs/{id}/items": Happy({"id": o["finished_run"]}, {"before": 1}),
        "POST /api/runs/{id}/cancel": Happy(run),
        "POST /api/runs/{id}/approvals/{approval_id}": Happy(
            {**run, "approval_id": "a1"}, body={"option_id": "allow"}
        ),
        "POST /api/runs/{id}/clarifications/{clarify_id}": Happy(
            {**run, "clarify_id": "q1"}, body={"answer": "yes"}
        ),
        "POST /api/sessions/{id}/goal": Happy(session, body={"action": "set", "text": "ship it"}),
        "GET /api/sessions/{id}/export": Happy(session, {"format": "json"}),
        "POST /api/projects/{id}/discover": Happy(project),
        "POST /api/projects/{id}/import": Happy(
            {"id": o["idle_project"]}, body={"agent_session_id": "agent-1"}
        ),
        "GET /api/jobs/{id}": Happy({"id": o["job"]}),
        "GET /api/search": Happy({}, {"q": "hello"}),
        "POST /api/sessions/{id}/attachments": Happy(
            idle, body={"file": b"more text"}, media_type="multipart/form-data"
        ),
        "GET /api/attachments/{id}/content": Happy({"id": o["attachment"]}),
        "GET /api/sessions/{id}/intents": Happy(session, {"include_closed": True}),
        "GET /api/intents/{id}": Happy(intent),
        "PATCH /api/intents/{id}": Happy(intent, body={"version": o["intent_version"], "text": "edited"}),
        "DELETE /api/intents/{id}": Happy(intent, {"version": o["intent_version"]}),
        "POST /api/intents/{id}/steer": Happy(intent, body={"run_id": o["run"]}),
        "POST /api/intents/{id}/stop-and-send": Happy(intent, body={}),
        "POST /api/tokens/revoke-all": Happy({}),
        "GET /api/workflows/{id}/triggers": Happy({"id": o["workflow"]}),
        "POST /api/workflows/{id}/triggers": Happy(
            {"id": o["workflow"]},
            body={"kind": "schedule", "cron": "30 6 * * *", "timezone": "Europe/Berlin"},
        ),
        "GET /api/workflows/{id}/firings": Happy({"id": o["workflow"]}),
        "GET /api/triggers/{id}": Happy({"id": o["trigger"]}),
        "PATCH /api/triggers/{id}": Happy({"id": o["trigger"]}, body={"enabled": False}),
        "DELETE /api/triggers/{id}": Happy({"id": o["trigger"]}),
        "POST /api/triggers/{id}/secret": Happy({"id": o["webhook"]}),
        "POST /api/hooks/{secret}": Happy({"secret": o["secret"]}, body={"ref": "main"}),
        "GET /api/runs/{id}/changes": Happy({"id": o["finished_run"]}),
        "GET /api/sessions/{id}/changes": Happy({"id": o["finished_session"]}),
        "GET /api/sessions/{id}/changes/summary": Happy(
            {"id": o["finished_session"]}, {"runs": str(o["finished_run"])}
        ),
        "GET /api/runs/{id}/changes/lines": Happy({"id": o["finished_run"]}, {"path": "notes.txt"}),
        "GET /api/sessions/{id}/changes/lines": Happy({"id": o["finished_session"]}, {"path": "notes.txt"}),
        "POST /api/runs/{id}/rewind": Happy({"id": o["finished_run"]}, body={"client_id": "rewind-1"}),
        "POST /api/checkpoints/{id}/restore": Happy({"id": o["checkpoint"]}, body={"client_id": "restore-1"}),
        "GET /api/projects/{id}/files": Happy(project, {"path": ""}),
        "GET /api/projects/{id}/files/content": Happy(project, {"path": "notes.txt"}),
        "PUT /api/projects/{id}/files/content": Happy(
            project, {"path": "created.txt"}, headers={"If-None-Match": "*"}
        ),
        "GET /api/projects/{id}/files/search": Happy(project, {"q": "notes"}),
        "GET /api/projects/{id}/git": Happy(project),
        "POST /api/projects/{id}/git/commit": Happy(
            {"id": o["git_project"]},
            body={"client_id": "commit-1", "message": "Fuzzed", "paths": ["fuzz.txt"]},
        ),
    }


LABELS = sorted(result.ok().label for result in schema.get_all_operations())


@pytest.mark.parametrize("label", LABELS)
def test_each_operation_succeeds_as_documented_on_real_objects(
    label: str, token: str, objects: dict[str, int], allowed_root: Path
) -> None:
    happy = happy_requests(objects, allowed_root)[label]
    method, path = label.split(" ", 1)
    case = schema[path][method].Case(
        path_parameters=happy.path, query=happy.query, body=happy.body, media_type=happy.media_type
    )
    headers = {"Authorization": f"Bearer {token}", **(happy.headers or {})}
    response = case.call_and_validate(headers=headers)

    assert 200 <= response.status_code < 300, (label, response.status_code, response.text[:300])
    TRIED[2] = TRIED.get(2, 0) + 1


def test_every_operation_has_a_happy_request(objects: dict[str, int], allowed_root: Path) -> None:
    assert sorted(happy_requests(objects, allowed_root)) == LABELS


# What the fuzzer found, kept as fixed examples: a JSON `true` or "1" taken as the number 1.
FOUND = [
    ("POST", "/api/intents/{intent}/steer", {"run_id": True}),
    ("POST", "/api/intents/{intent}/stop-and-send", {"run_id": "1"}),
    ("PATCH", "/api/intents/{intent}", {"version": True, "text": "x"}),
    ("POST", "/api/workflows/{workflow}/launch", {"session_id": True, "variables": {"thing": "x"}}),
    ("POST", "/api/sessions/{session}/messages", {"client_id": "c", "text": "x", "attachments": [True]}),
]


@pytest.mark.parametrize(("method", "path", "body"), FOUND)
def test_a_boolean_or_a_string_is_not_taken_for_a_number(
    token: str, objects: dict[str, int], method: str, path: str, body: dict[str, Any]
) -> None:
    client = Client(headers={"Authorization": f"Bearer {token}"})

    response = client.generic(
        method, path.format(**objects), orjson.dumps(body), content_type="application/json"
    )

    assert response.status_code == 422, response.content
    assert response.json()["code"] == "validation_error"
    assert PendingIntent.objects.get(pk=objects["intent"]).state == IntentState.WAITING


def test_the_fuzzed_document_is_the_one_the_api_serves(token: str) -> None:
    response = Client(headers={"Authorization": f"Bearer {token}"}).get("/api/openapi.json")

    assert response.status_code == 200
    served = orjson.loads(response.content)
    assert served == served_document()
