"""The error contract: every failure is JSON `{code, message, details?}`; no input causes a 500."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
from django.test import Client

from hermesweb.api import api as ninja_api
from hermesweb.errors import validation_details
from runs.models import RunStatus
from tests.factories import PendingIntentFactory, RunFactory, WorkflowFactory, run_with_events

pytestmark = pytest.mark.django_db

JUNK_BODIES: list[bytes] = [
    b"",
    b"null",
    b"[]",
    b"{}",
    b'"text"',
    b"1e999",
    b"{",
    b"\xff\xfe\x00",
    b"[" * 5000 + b"]" * 5000,
    b'{"version": 1e400, "position": 1e400}',
    b'{"version": 100000000000000000000000000000, "position": -100000000000000000000000}',
    b'{"client_id": {"$gt": ""}, "text": [], "mode": null, "attachments": {"a": 1}}',
    b'{"client_id": "c", "text": "\\ud800"}',
    b'{"name": "x", "path": "/\\u0000", "agent": "\\u0000"}',
    b'{"option_id": "' + b"o" * 100_000 + b'"}',
    b'{"answer": {"nested": ' * 200 + b"1" + b"}" * 400,
    b'{"session_id": -1, "variables": {"": ""}}',
    b'{"session_id": 99999999999999999999999, "variables": []}',
    b'{"action": "set", "text": null}',
    b'{"title": 1, "status": ["archived"]}',
]


# Downloads answer in their own media type when they succeed; their errors are JSON like any other.
DOWNLOADS = {("GET", "/api/sessions/{id}/export")}


def every_operation() -> list[tuple[str, str]]:
    schema = ninja_api.get_openapi_schema(path_prefix="/api")
    return [(method.upper(), path) for path, methods in schema["paths"].items() for method in methods]


@pytest.fixture
def objects(session: Any) -> dict[str, Any]:
    run = run_with_events(
        [
            ("run.started", {"status": "running"}),
            ("approval.requested", {"approval_id": "a1", "options": [{"option_id": "allow"}]}),
            ("clarify.requested", {"clarify_id": "q1", "question": "?"}),
        ],
        session=session,
        status=RunStatus.AWAITING_APPROVAL,
    )
    return {
        "projects": session.project,
        "workflows": WorkflowFactory(project=session.project, prompt_template="Do {thing}"),
        "sessions": session,
        "runs": run,
        "intents": PendingIntentFactory(session=session),
    }


def fill(path: str, objects: dict[str, Any]) -> str:
    kind = path.split("/")[2]
    path = path.replace("{approval_id}", "a1").replace("{clarify_id}", "q1")
    return path.replace("{id}", str(objects[kind].pk)) if kind in objects else path


@pytest.mark.parametrize(("method", "path"), every_operation())
def test_no_junk_body_makes_any_endpoint_fail_with_a_500(
    api: Client, objects: dict[str, Any], method: str, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = fill(path, objects)
    for body in JUNK_BODIES:
        with caplog.at_level(logging.ERROR, logger="hermesweb.api"):
            response = api.generic(method, url, body, content_type="application/json")

        assert response.status_code < 500, (url, body[:60], response.content[:300])
        if (method, path) not in DOWNLOADS or response.status_code >= 400:
            assert response["Content-Type"].startswith("application/json"), (url, body[:60])
        if response.status_code >= 400:
            error = response.json()
            assert set(error) <= {"code", "message", "details"}
            assert isinstance(error["code"], str) and isinstance(error["message"], str)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize(("method", "path"), [op for op in every_operation() if "{id}" in op[1]])
@pytest.mark.parametrize("pk", ["0", "-7", "abc", "1.5", str(2**63), str(10**50)])
def test_impossible_ids_are_404_or_422_on_every_endpoint(
    api: Client, method: str, path: str, pk: str
) -> None:
    url = re.sub(r"\{[a-z_]+\}", "x", path.replace("{id}", pk)).replace("/x", "/a1")

    response = api.generic(method, url, b"{}", content_type="application/json")

    assert response.status_code in (404, 422), (url, response.content)
    assert response.json()["code"] in ("not_found", "validation_error")


def test_an_unexpected_exception_is_logged_and_answered_as_internal_error(
    api: Client, session: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr("runs.transcript_pages.newest_turns", broken)
    RunFactory(session=session)

    with caplog.at_level(logging.ERROR, logger="hermesweb.api"):
        response = api.get(f"/api/sessions/{session.pk}/transcript")

    assert response.status_code == 500
    assert response.json() == {"code": "internal_error", "message": "Internal error; it has been logged."}
    assert "a bug" not in response.content.decode()
    assert any(r.exc_info and r.exc_info[1].args == ("a bug",) for r in caplog.records)


def test_a_wrong_method_is_not_a_500(api: Client, session: Any) -> None:
    response = api.put(f"/api/sessions/{session.pk}", {}, content_type="application/json")
    assert response.status_code == 405


def test_validation_details_name_body_query_and_path_fields() -> None:
    details = validation_details(
        [
            {
                "loc": ("body", "payload", "variables", "n"),
                "msg": "Input should be a valid string",
                "type": "str",
            },
            {"loc": ("body", "payload"), "msg": "Field required", "type": "missing"},
            {"loc": ("query", "limit"), "msg": "too small", "type": "greater_than_equal"},
            {"loc": ("path", "id"), "msg": "not an int", "type": "int_parsing"},
        ]
    )
    assert [(d["location"], d["field"]) for d in details] == [
        ("body", "variables.n"),
        ("body", "body"),
        ("query", "limit"),
        ("path", "id"),
    ]


def test_a_database_that_cannot_be_reached_is_a_503_to_send_again_not_a_500(
    api: Client, session: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import OperationalError

    def unreachable(*args: Any, **kwargs: Any) -> None:
        raise OperationalError("couldn't get a connection after 10.00 sec")

    monkeypatch.setattr("runs.transcript_pages.newest_turns", unreachable)
    RunFactory(session=session)

    response = api.get(f"/api/sessions/{session.pk}/transcript")

    assert response.status_code == 503
    assert response["Retry-After"] == "2"
    assert response.json()["code"] == "database_unavailable"
