"""Webhooks (issue 42): `POST /api/hooks/<secret>` fires the workflow with the body's fields.

The secret is the credential: no cookie, no token, no CSRF. Bad secrets, bodies and rates get
their 4xx; the body's fields reach the prompt as data (never template) and the run, through a
real runner. docs/automations.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from automations.models import Firing, FiringOutcome, Trigger
from runs.models import Run, RunStatus
from tests import factories
from tests.support import procs
from tests.support.runs import types, wait_status


@pytest.fixture
def workflow(project: Any) -> Any:
    return factories.WorkflowFactory(project=project, prompt_template="fast triage of {branch}: {status}")


def make_hook(api: Client, workflow: Any, **fields: Any) -> tuple[int, str]:
    created = api.post(
        f"/api/workflows/{workflow.pk}/triggers",
        {"kind": "webhook", **fields},
        content_type="application/json",
    ).json()
    return created["id"], "/" + created["url"].split("/", 3)[-1]


def call(url: str, body: Any = None, *, raw: bytes | None = None, client: Client | None = None) -> Any:
    data = raw if raw is not None else json.dumps(body if body is not None else {})
    return (client or Client()).post(url, data, content_type="application/json")


@pytest.mark.django_db
def test_a_call_fires_with_the_bodys_fields_as_data_never_template(api: Client, workflow: Any) -> None:
    _, url = make_hook(api, workflow)
    body = {"branch": "main", "status": "{branch} {0} {x.__class__} {{braces}} %s", "extra": [1, 2]}
    response = call(url, body)
    assert response.status_code == 202, response.content
    answer = response.json()
    firing = Firing.objects.get(pk=answer["firing_id"])
    assert answer == {
        "firing_id": firing.pk,
        "outcome": "launched",
        "session_id": firing.session_id,
        "run_id": firing.run_id,
        "intent_id": None,
    }
    run = Run.objects.get(pk=answer["run_id"])
    # Braces in a value are text: str.format inserted it in one pass.
    assert run.prompt_text == "fast triage of main: {branch} {0} {x.__class__} {{braces}} %s"
    assert run.source_meta["variables"]["extra"] == "[1,2]"


@pytest.mark.django_db
def test_a_webhook_needs_no_cookie_token_or_csrf(api: Client, workflow: Any, user: Any) -> None:
    _, url = make_hook(api, workflow)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user)
    assert call(url, {"branch": "a", "status": "b"}, client=browser).status_code == 202
    wrong_token = Client(headers={"Authorization": "Bearer hw_not_a_token"})
    response = call(url, {"branch": "a", "status": "c"}, client=wrong_token)
    # The first call's run is still queued: this one is recorded, skipped for the overlap.
    assert response.status_code == 202 and response.json()["outcome"] == "skipped_overlap"


@pytest.mark.django_db
def test_unknown_rotated_and_disabled_secrets_are_404(api: Client, workflow: Any) -> None:
    trigger_id, url = make_hook(api, workflow)
    assert call(url + "x", {}).status_code == 404
    assert call("/api/hooks/hw_hook_" + "a" * 43, {}).status_code == 404
    assert call("/api/hooks/nothing", {}).status_code == 404
    assert call(f"/api/hooks/{Trigger.objects.get().secret_digest}", {}).status_code == 404

    api.post(f"/api/triggers/{trigger_id}/secret")
    assert call(url, {"branch": "a", "status": "b"}).status_code == 404

    _, url = make_hook(api, workflow)
    api.patch(
        f"/api/triggers/{Trigger.objects.latest('id').pk}",
        {"enabled": False},
        content_type="application/json",
    )
    assert call(url, {"branch": "a", "status": "b"}).status_code == 404
    assert not Firing.objects.exists()


@pytest.mark.django_db
def test_bad_bodies_get_their_4xx(api: Client, workflow: Any) -> None:
    _, url = make_hook(api, workflow)
    big = call(url, raw=json.dumps({"branch": "x" * (64 * 1024)}).encode())
    assert big.status_code == 413 and big.json()["code"] == "request_too_large"
    assert call(url, raw=b"{not json").status_code == 400
    listed = call(url, raw=b"[1, 2]")
    assert listed.status_code == 422 and listed.json()["code"] == "validation_error"
    assert call(url, raw=b'{"branch": "a\\u0000"}').status_code == 422
    assert not Firing.objects.exists()

    missing = call(url, {"branch": "main"})
    assert missing.status_code == 422 and missing.json()["code"] == "missing_variables"
    firing = Firing.objects.get(pk=missing.json()["details"]["firing_id"])
    assert firing.outcome == FiringOutcome.FAILED and "status" in firing.reason
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_calls_past_the_rate_are_429_with_retry_after(api: Client, workflow: Any, settings: Any) -> None:
    settings.HERMESWEB_WEBHOOK_RATE_PER_MINUTE = 2
    _, url = make_hook(api, workflow)
    assert call(url, {"branch": "a", "status": "1"}).status_code == 202
    assert call(url, {"branch": "a", "status": "2"}).status_code == 202
    limited = call(url, {"branch": "a", "status": "3"})
    assert limited.status_code == 429 and limited.json()["code"] == "rate_limited"
    assert 1 <= int(limited["Retry-After"]) <= 60
    assert Firing.objects.count() == 2
    # Per trigger: another webhook of the same workflow is not limited by this one's calls.
    _, other = make_hook(api, workflow, overlap="queue")
    assert call(other, {"branch": "b", "status": "1"}).status_code == 202


@pytest.mark.django_db(transaction=True)
def test_the_bodys_fields_reach_the_prompt_and_the_run(
    api: Client, workflow: Any, runners: list[Any], logs: Path
) -> None:
    _, url = make_hook(api, workflow)
    response = call(url, {"branch": "release-7", "status": "red on arm64"})
    assert response.status_code == 202, response.content
    runner = procs.start_runner(logs, "hook", HERMESWEB_DEMO_DELAY="0.005")
    runners.append(runner)
    run = Run.objects.get(pk=response.json()["run_id"])
    wait_status(run, RunStatus.COMPLETED, timeout=60, log=lambda: f"{runner.log()}\n{types(run)}")
    run.refresh_from_db()
    assert run.prompt_text == "fast triage of release-7: red on arm64"
    answer = "".join(
        e.payload.get("delta", "") for e in run.events.filter(type="token.delta").order_by("seq")
    )
    assert "release-7" in answer and "red on arm64" in answer  # the demo agent quotes its prompt


def test_a_large_body_is_refused_before_it_is_read_and_a_secret_is_masked_in_logs() -> None:
    from automations.services import new_secret
    from hermesweb.body_limit import limit_for
    from runs.redaction import redact_text

    assert limit_for("POST", "/api/hooks/hw_hook_abc") == 64 * 1024
    assert limit_for("POST", "/api/hooks/hw_hook_abc/more") > 64 * 1024  # not the hook's route
    secret = new_secret()
    assert secret not in redact_text(f"POST /api/hooks/{secret} 202")
