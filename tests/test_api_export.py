"""GET /api/sessions/{id}/export: the materialized transcript as a Markdown or JSON download."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def exported(session: Any) -> Any:
    session.title = "Fix the parser"
    session.save()
    factories.run_with_events(
        [
            ("run.started", {"status": "running"}),
            ("token.delta", {"message_id": "m1", "delta": "Looking "}),
            ("token.delta", {"message_id": "m1", "delta": "at it."}),
            ("tool.started", {"tool_call_id": "t1", "title": "ls", "status": "in_progress"}),
            ("tool.done", {"tool_call_id": "t1", "status": "completed"}),
            ("done", {"state": "completed", "stop_reason": "end_turn"}),
        ],
        session=session,
        status="running",
        prompt_text="Why does it fail?",
    )
    return session


def test_markdown_export_is_a_markdown_attachment_with_prompt_and_answer(api: Client, exported: Any) -> None:
    response = api.get(f"/api/sessions/{exported.pk}/export?format=markdown")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/markdown")
    assert response["Content-Disposition"] == f'attachment; filename="fix-the-parser-{exported.pk}.md"'
    text = response.getvalue().decode()
    assert text.startswith("# Fix the parser")
    assert "Why does it fail?" in text and "Looking at it." in text and "`ls`" in text


def test_markdown_is_the_default_format(api: Client, exported: Any) -> None:
    response = api.get(f"/api/sessions/{exported.pk}/export")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/markdown")


def test_json_export_carries_every_turn_with_its_materialized_state(bearer: Client, exported: Any) -> None:
    response = bearer.get(f"/api/sessions/{exported.pk}/export?format=json")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response["Content-Disposition"].endswith(f'-{exported.pk}.json"')
    data = json.loads(response.getvalue())
    assert data["session"]["id"] == exported.pk
    [turn] = data["turns"]
    assert turn["prompt"]["text"] == "Why does it fail?"
    assert turn["state"]["text"] == "Looking at it."
    assert turn["state"]["terminal_state"] == "completed"


def test_an_unknown_format_is_a_validation_error(api: Client, exported: Any) -> None:
    response = api.get(f"/api/sessions/{exported.pk}/export?format=pdf")
    assert response.status_code == 422
    assert response.json()["code"] == "validation_error"


def test_someone_elses_session_is_not_found(exported: Any, other_user: Any) -> None:
    client = Client()
    client.force_login(other_user)
    response = client.get(f"/api/sessions/{exported.pk}/export")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_export_needs_a_signed_in_caller(anonymous: Client, exported: Any) -> None:
    response = anonymous.get(f"/api/sessions/{exported.pk}/export")
    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"
