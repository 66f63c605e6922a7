"""`@` mentions: project paths a message names reach the agent beside its text.

They ride in the turn's (or intent's) stored attachments as `{"mention": path}`, so a repeated
client_id is the same turn and a queued message keeps them; the runner sends a small text file
as an embedded `resource` when the agent takes embedded context, anything else as a
`resource_link`, and says so when the path is gone. With the demo agent and the real Hermes.
docs/workspace.md ("Mentions").
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from acp import schema
from django.test import Client

from intents.models import PendingIntent
from runs.models import Run, RunStatus
from tests import factories
from tests.support.hermes import AgentConfig
from tests.support.live import LiveStack, layer, live, session_cookie  # noqa: F401 - fixtures
from tests.support.procs import Proc, start_runner
from tests.support.runs import assert_journal_well_formed, state, wait_status
from tests.support.scripted_llm import ScriptedLLM, request_text, text
from workspace.mentions import EMBED_MAX_BYTES, mention_blocks

pytestmark = pytest.mark.django_db

JSON = "application/json"


@pytest.fixture
def session(user: Any) -> Any:
    session = factories.SessionFactory(project__owner=user, project__agent="demo")
    root = Path(session.project.path)
    (root / "src").mkdir()
    (root / "src" / "notes.txt").write_text("MENTION-7f3 remember this\n")
    (root / "big.log").write_text("x" * (EMBED_MAX_BYTES + 1))
    return session


def send(
    api: Client, session: Any, text: str, mentions: list[str], client_id: str | None = None, **extra: Any
) -> Any:
    body = {"client_id": client_id or uuid.uuid4().hex, "text": text, "mentions": mentions, **extra}
    return api.post(f"/api/sessions/{session.pk}/messages", body, content_type=JSON)


def test_a_message_stores_its_mentions_beside_its_attachments_once(api: Client, session: Any) -> None:
    first = send(api, session, "look at @src/notes.txt", ["src/notes.txt", "./src//notes.txt", "src"], "m1")
    again = send(api, session, "look at @src/notes.txt", ["src/notes.txt"], "m1")
    assert first.status_code == 202 and again.json()["duplicate"] is True
    assert again.json()["run_id"] == first.json()["run_id"]
    run = Run.objects.get(pk=first.json()["run_id"])
    assert run.attachments == [{"mention": "src/notes.txt"}, {"mention": "src"}]
    turn = api.get(f"/api/sessions/{session.pk}/transcript").json()["turns"][-1]
    assert turn["attachments"] == run.attachments  # what the transcript draws chips from


def test_a_path_outside_the_project_is_refused(api: Client, session: Any) -> None:
    for path in ["../escape", "/etc/passwd", ".git/config", "."]:
        refused = send(api, session, "look", [path])
        assert refused.status_code == 422, path
        assert refused.json()["code"] in ("invalid_mention", "invalid_input"), refused.json()
    assert send(api, session, "look", ["../x"]).json()["code"] == "invalid_mention"
    assert not Run.objects.filter(session=session).exists()


def test_a_message_queued_behind_a_running_turn_keeps_its_mentions(api: Client, session: Any) -> None:
    factories.RunFactory(session=session, status=RunStatus.RUNNING)
    queued = send(api, session, "and this", ["src/notes.txt"], mode="queue")
    assert queued.json()["kind"] == "queue"
    assert PendingIntent.objects.get(pk=queued.json()["intent_id"]).attachments == [
        {"mention": "src/notes.txt"}
    ]


@pytest.mark.django_db(transaction=True)
def test_a_socket_submit_carries_mentions_by_the_same_rules(live: LiveStack) -> None:
    live.start_daphne()
    session = factories.SessionFactory()
    socket = live.socket(session.pk, session_cookie(session.project.owner))
    socket.send(type="submit", client_id="bad", text="look", mentions=["../out"])
    socket.send(type="submit", client_id="good", text="look", mentions=["README.md"])
    refused = socket.until(lambda f: f["type"] == "submitted" and f["client_id"] == "bad")[-1]
    assert (refused["error"]["status"], refused["error"]["code"]) == (422, "invalid_mention")
    sent = socket.until(lambda f: f["type"] == "submitted" and f["client_id"] == "good")[-1]
    assert Run.objects.get(pk=sent["result"]["run_id"]).attachments == [{"mention": "README.md"}]


# ---------------------------------------------------------------- the prompt's blocks


def test_small_text_is_embedded_and_the_rest_linked(session: Any, tmp_path: Path) -> None:
    root = session.project.path
    outside = tmp_path / "secret.txt"
    outside.write_text("SECRET")
    (Path(root) / "leak.txt").symlink_to(outside)
    notes, big, folder, gone, leak = mention_blocks(
        root, ["src/notes.txt", "big.log", "src", "nope.txt", "leak.txt"], {"embeddedContext": True}
    )
    assert isinstance(notes, schema.EmbeddedResourceContentBlock)
    assert notes.resource.text == "MENTION-7f3 remember this\n"
    assert notes.resource.uri == (Path(root) / "src" / "notes.txt").as_uri()
    assert isinstance(big, schema.ResourceContentBlock) and big.size == EMBED_MAX_BYTES + 1
    assert isinstance(folder, schema.ResourceContentBlock) and folder.mime_type == "inode/directory"
    assert isinstance(gone, schema.TextContentBlock) and "nope.txt" in gone.text
    assert isinstance(leak, schema.ResourceContentBlock)  # named, never read through
    linked = mention_blocks(root, ["src/notes.txt"], {})
    assert isinstance(linked[0], schema.ResourceContentBlock)  # no embedded context: a link
    assert linked[0].uri.endswith("/src/notes.txt") and linked[0].name == "notes.txt"


@pytest.mark.django_db(transaction=True)
def test_the_demo_agent_receives_the_mentions(
    api: Client, runners: list[Proc], logs: Path, user: Any
) -> None:
    session = factories.SessionFactory(project__owner=user, project__agent="demo")
    root = Path(session.project.path)
    (root / "src").mkdir()
    notes = "MENTION-7f3 remember this\n"
    (root / "src" / "notes.txt").write_text(notes)
    runner = start_runner(logs, "r1", HERMESWEB_DEMO_DELAY="0.005")
    runners.append(runner)
    response = send(api, session, "fast what is in @src/notes.txt and @src", ["src/notes.txt", "src"])
    run = wait_status(Run.objects.get(pk=response.json()["run_id"]), RunStatus.COMPLETED, log=runner.log)
    said = state(run)["text"]
    assert f"Received file notes.txt (text/plain, {len(notes)} bytes)." in said
    assert f"Received link {(root / 'src').as_uri()} (inode/directory)." in said


# ---------------------------------------------------------------- the real Hermes


@pytest.fixture
def hermes_session(db: None, settings: Any, hermes_agent_config: AgentConfig) -> Any:
    from runs.agents import load_agents

    environ = {"HERMESWEB_AGENTS": json.dumps({"hermes": hermes_agent_config})}
    configured = load_agents(settings.DATA_DIR, environ)
    settings.HERMESWEB_AGENTS = {**settings.HERMESWEB_AGENTS, "hermes": configured["hermes"]}
    return factories.SessionFactory(project__agent="hermes")


@pytest.mark.hermes
@pytest.mark.django_db(transaction=True)
def test_hermes_receives_the_mentioned_file(
    runners: list[Proc],
    logs: Path,
    hermes_agent_config: AgentConfig,
    hermes_session: Any,
    scripted_llm: ScriptedLLM,
) -> None:
    env = {"HERMESWEB_AGENTS": json.dumps({"hermes": hermes_agent_config})}
    runner = start_runner(logs, "hermes-runner", **env)
    runners.append(runner)
    root = Path(hermes_session.project.path)
    (root / "notes.txt").write_text("MENTION-7f3 the launch code is teal\n")
    scripted_llm.enqueue(text("It says teal."))
    api = Client()
    api.force_login(hermes_session.project.owner)
    response = send(api, hermes_session, "What does @notes.txt say?", ["notes.txt"])
    run = wait_status(
        Run.objects.get(pk=response.json()["run_id"]), RunStatus.COMPLETED, timeout=90, log=runner.log
    )
    assert_journal_well_formed(run)
    sent = "\n".join(request_text(body) for body in scripted_llm.scripted_requests)
    # Hermes takes the file whole (embedded) or its link: either way the model is told of it.
    assert "MENTION-7f3" in sent or (root / "notes.txt").as_uri() in sent, sent[-2000:]
    assert "It says teal." in state(run)["text"]
