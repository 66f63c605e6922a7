"""Authentication: session (with CSRF) or personal token; anonymous callers get 401 everywhere."""

from __future__ import annotations

import re
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from hermesweb.api import api as ninja_api
from hermesweb.models import ApiToken
from tests.factories import ApiTokenFactory, ProjectFactory, UserFactory

pytestmark = pytest.mark.django_db

UNAUTHENTICATED = {
    "code": "not_authenticated",
    "message": "Sign in, or send 'Authorization: Bearer <token>'.",
}


# A webhook's secret in its path is its credential (docs/automations.md): no session, no token.
SECRET_IS_THE_CREDENTIAL = {("POST", "/api/hooks/1")}


def every_operation() -> list[tuple[str, str]]:
    schema = ninja_api.get_openapi_schema(path_prefix="/api")
    operations = [
        (method.upper(), re.sub(r"\{[^}]+\}", "1", path))
        for path, methods in schema["paths"].items()
        for method in methods
    ]
    return [operation for operation in operations if operation not in SECRET_IS_THE_CREDENTIAL]


def test_an_anonymous_call_to_a_webhook_with_an_unknown_secret_finds_nothing(anonymous: Client) -> None:
    response = anonymous.post("/api/hooks/1", "{}", content_type="application/json")
    assert response.status_code == 404


@pytest.mark.parametrize(("method", "path"), every_operation())
def test_every_endpoint_answers_401_json_to_an_anonymous_caller(
    anonymous: Client, method: str, path: str
) -> None:
    response = anonymous.generic(method, path, "{}", content_type="application/json")

    assert response.status_code == 401
    assert response["Content-Type"].startswith("application/json")
    assert response.json() == UNAUTHENTICATED


def test_the_contract_lists_every_endpoint_of_issue_2() -> None:
    operations = set(every_operation())
    expected = {
        ("GET", "/api/projects"), ("POST", "/api/projects"),
        ("GET", "/api/projects/1"), ("PATCH", "/api/projects/1"), ("DELETE", "/api/projects/1"),
        ("GET", "/api/projects/1/workflows"), ("POST", "/api/projects/1/workflows"),
        ("GET", "/api/workflows/1"), ("PATCH", "/api/workflows/1"), ("DELETE", "/api/workflows/1"),
        ("POST", "/api/workflows/1/launch"),
        ("GET", "/api/projects/1/sessions"), ("POST", "/api/projects/1/sessions"),
        ("GET", "/api/sessions/1"), ("PATCH", "/api/sessions/1"), ("DELETE", "/api/sessions/1"),
        ("POST", "/api/sessions/1/messages"), ("GET", "/api/sessions/1/transcript"),
        ("GET", "/api/runs/1"), ("GET", "/api/runs/1/events"),
        ("POST", "/api/runs/1/cancel"), ("POST", "/api/runs/1/approvals/1"),
        ("POST", "/api/runs/1/clarifications/1"), ("POST", "/api/sessions/1/goal"),
        ("GET", "/api/sessions/1/intents"), ("PATCH", "/api/intents/1"), ("DELETE", "/api/intents/1"),
        ("POST", "/api/intents/1/steer"), ("POST", "/api/intents/1/stop-and-send"),
        ("GET", "/api/health"),
    }  # fmt: skip
    assert expected <= operations


def test_the_openapi_docs_need_a_login(anonymous: Client, api: Client, bearer: Client) -> None:
    assert anonymous.get("/api/docs").status_code == 401
    assert anonymous.get("/api/openapi.json").json() == UNAUTHENTICATED
    assert api.get("/api/docs").status_code == 200
    assert bearer.get("/api/openapi.json").json()["info"]["title"] == "hermesweb"


def test_an_unknown_api_path_is_a_json_404(api: Client) -> None:
    response = api.get("/api/no/such/thing")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


# ---------------------------------------------------------------- tokens


def test_a_personal_token_authenticates_without_a_session(bearer: Client, project: Any) -> None:
    response = bearer.get("/api/projects")
    assert response.status_code == 200
    assert [p["id"] for p in response.json()] == [project.pk]


def test_a_token_caller_needs_no_csrf_token_for_unsafe_methods(user: Any, allowed_root: Any) -> None:
    _, raw = ApiToken.issue(user)
    client = Client(enforce_csrf_checks=True, headers={"Authorization": f"Bearer {raw}"})
    project = ProjectFactory(owner=user)

    response = client.post(
        f"/api/projects/{project.pk}/sessions", {"title": "x"}, content_type="application/json"
    )
    assert response.status_code == 201


def test_using_a_token_records_when_it_was_last_used(user: Any) -> None:
    token, raw = ApiToken.issue(user)
    Client(headers={"Authorization": f"Bearer {raw}"}).get("/api/projects")
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_last_used_is_written_at_most_once_a_minute(user: Any) -> None:
    token, raw = ApiToken.issue(user)
    client = Client(headers={"Authorization": f"Bearer {raw}"})
    client.get("/api/projects")
    first = ApiToken.objects.get(pk=token.pk).last_used_at
    assert first is not None

    client.get("/api/projects")
    assert ApiToken.objects.get(pk=token.pk).last_used_at == first

    ApiToken.objects.filter(pk=token.pk).update(last_used_at=first - timedelta(minutes=2))
    client.get("/api/projects")
    assert ApiToken.objects.get(pk=token.pk).last_used_at > first


@pytest.mark.parametrize(
    "header", ["Bearer hw_not-a-real-token", "Bearer ", "bearer " + "x" * 5000, "Bearer \u00e9\u00e9"]
)
def test_a_wrong_token_is_a_401(user: Any, header: str) -> None:
    response = Client(headers={"Authorization": header}).get("/api/projects")
    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"


def test_a_revoked_token_is_a_401(user: Any) -> None:
    token, raw = ApiToken.issue(user)
    ApiToken.objects.filter(pk=token.pk).update(revoked_at=timezone.now())

    response = Client(headers={"Authorization": f"Bearer {raw}"}).get("/api/projects")
    assert response.status_code == 401


def test_the_token_of_an_inactive_user_is_a_401() -> None:
    token = ApiTokenFactory(user=UserFactory(is_active=False), raw="hw_inactive_user_token")
    response = Client(headers={"Authorization": "Bearer hw_inactive_user_token"}).get("/api/projects")
    assert token.pk
    assert response.status_code == 401


def test_a_wrong_token_does_not_fall_back_to_the_session_cookie(api: Client) -> None:
    response = api.get("/api/projects", headers={"Authorization": "Bearer hw_wrong"})
    assert response.status_code == 401


def test_another_authorization_scheme_is_ignored_in_favour_of_the_session(api: Client) -> None:
    response = api.get("/api/projects", headers={"Authorization": "Basic dXNlcjpwYXNz"})
    assert response.status_code == 200


# ---------------------------------------------------------------- session and CSRF


def test_a_session_caller_without_a_csrf_token_is_refused_for_unsafe_methods(user: Any, project: Any) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)

    response = client.post(f"/api/projects/{project.pk}/sessions", {}, content_type="application/json")

    assert response.status_code == 403
    assert response.json()["code"] == "csrf_failed"


def test_a_session_caller_with_the_csrf_token_may_write(user: Any, project: Any) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    token = "k" * 32  # what the csrftoken cookie holds; the browser echoes it in X-CSRFToken
    client.cookies["csrftoken"] = token

    response = client.post(
        f"/api/projects/{project.pk}/sessions",
        {"title": "with csrf"},
        content_type="application/json",
        headers={"X-CSRFToken": token},
    )
    assert response.status_code == 201


def test_safe_methods_need_no_csrf_token(user: Any) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.get("/api/projects").status_code == 200


def test_an_anonymous_post_is_a_401_not_a_csrf_403(project: Any) -> None:
    client = Client(enforce_csrf_checks=True)
    response = client.post(f"/api/projects/{project.pk}/sessions", {}, content_type="application/json")
    assert response.status_code == 401


# ---------------------------------------------------------------- create_token


def test_create_token_prints_a_token_that_authenticates(user: Any) -> None:
    out = StringIO()
    call_command("create_token", user.username, "--name", "ci", stdout=out)
    raw = out.getvalue().strip()

    assert raw.startswith("hw_")
    token = ApiToken.objects.get(user=user)
    assert token.name == "ci"
    assert raw not in (token.digest, token.prefix)
    assert Client(headers={"Authorization": f"Bearer {raw}"}).get("/api/projects").status_code == 200


def test_create_token_refuses_an_unknown_user(db: None) -> None:
    with pytest.raises(CommandError, match="nobody"):
        call_command("create_token", "nobody", stdout=StringIO())


def test_create_token_refuses_an_inactive_user() -> None:
    UserFactory(username="gone", is_active=False)
    with pytest.raises(CommandError, match="inactive"):
        call_command("create_token", "gone", stdout=StringIO())
