"""Attachments with the real Hermes (`hermes-acp`): an uploaded PNG reaches the model server.

Hermes advertises `promptCapabilities.image`; an `image` block in `session/prompt` is sent to
the model as an `image_url` part of a user message (first in a separate describe request,
../shared/docs/hermes-acp.md), then the turn goes on with the prompt text.
"""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from runs.models import Run, Runner, RunStatus
from tests import factories
from tests.support.hermes import AgentConfig
from tests.support.images import png
from tests.support.procs import Proc, start_runner
from tests.support.runs import assert_journal_well_formed, state, wait_status
from tests.support.scripted_llm import ScriptedLLM, request_text, text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.hermes]


@pytest.fixture
def runner(runners: list[Proc], logs: Path, hermes_agent_config: AgentConfig) -> Proc:
    env = {"HERMESWEB_AGENTS": json.dumps({"hermes": {**hermes_agent_config, "cumulative_usage": True}})}
    proc = start_runner(logs, "hermes-runner", **env)
    runners.append(proc)
    return proc


@pytest.fixture
def session(db: None, settings: Any, hermes_agent_config: AgentConfig) -> Any:
    # The web side validates agent names against its own registry.
    from runs.agents import load_agents

    environ = {"HERMESWEB_AGENTS": json.dumps({"hermes": hermes_agent_config})}
    configured = load_agents(settings.DATA_DIR, environ)
    settings.HERMESWEB_AGENTS = {**settings.HERMESWEB_AGENTS, "hermes": configured["hermes"]}
    return factories.SessionFactory(project__agent="hermes")


def image_parts(body: dict[str, Any]) -> list[str]:
    """The image URLs in the user messages of one chat-completions request."""
    urls: list[str] = []
    for message in body.get("messages", []):
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, list):
            urls += [part["image_url"]["url"] for part in content if part.get("type") == "image_url"]
    return urls


def test_an_uploaded_png_reaches_the_model_server_as_an_image_part(
    runner: Proc, session: Any, scripted_llm: ScriptedLLM
) -> None:
    image = png(16, 16, (10, 120, 220))
    api = Client()
    api.force_login(session.project.owner)
    file = SimpleUploadedFile("diagram.png", image, content_type="image/png")
    uploaded = api.post(f"/api/sessions/{session.pk}/attachments", {"file": file})
    assert uploaded.status_code == 201, uploaded.content
    scripted_llm.enqueue(text("I see a blue square."))

    body = {
        "client_id": uuid.uuid4().hex,
        "text": "What is in ATTACH-7c1?",
        "attachments": [uploaded.json()["id"]],
    }
    response = api.post(f"/api/sessions/{session.pk}/messages", body, content_type="application/json")

    run = wait_status(
        Run.objects.get(pk=response.json()["run_id"]), RunStatus.COMPLETED, timeout=90, log=runner.log
    )
    assert_journal_well_formed(run)
    expected = f"data:image/png;base64,{base64.b64encode(image).decode()}"
    requests = scripted_llm.requests
    assert [url for body in requests for url in image_parts(body)] == [expected]
    assert any("ATTACH-7c1" in request_text(body) for body in scripted_llm.scripted_requests)
    assert "I see a blue square." in state(run)["text"]
    capabilities = Runner.objects.get(pk="hermes-runner").agent_capabilities["hermes"]
    assert capabilities["prompt_capabilities"]["image"] is True  # what uploads are checked against
