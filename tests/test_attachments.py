"""Attachments: upload, limits and types, owner-only content, messages that carry them, the
prompt blocks the runner sends, and the demo agent acknowledging what it got (docs/agents.md)."""

from __future__ import annotations

import base64
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from acp import schema
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from intents.models import PendingIntent
from runs.models import Attachment, Run, Runner, RunStatus
from runs.runner.prompt_content import AttachmentFile, content_blocks
from tests import factories
from tests.support.images import png
from tests.support.live import LiveStack, layer, live, session_cookie  # noqa: F401 - fixtures
from tests.support.procs import Proc, start_runner
from tests.support.runs import state, wait_status

pytestmark = pytest.mark.django_db

JSON = "application/json"
PNG = png()


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, settings: Any) -> Path:
    """Each test's own data directory (the runner subprocess is handed the same one)."""
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()
    return settings.DATA_DIR


def upload(client: Client, session_id: int, name: str, data: bytes, content_type: str = "") -> Any:
    file = SimpleUploadedFile(name, data, content_type=content_type or "application/octet-stream")
    return client.post(f"/api/sessions/{session_id}/attachments", {"file": file})


def send(client: Client, session_id: int, text: str, attachments: list[int], **extra: Any) -> Any:
    body = {"client_id": uuid.uuid4().hex, "text": text, "attachments": attachments, **extra}
    return client.post(f"/api/sessions/{session_id}/messages", body, content_type=JSON)


def stored_file(data_dir: Path, attachment_id: int) -> Path:
    return data_dir / Attachment.objects.get(pk=attachment_id).path


# ---------------------------------------------------------------- upload


def test_an_uploaded_png_is_stored_owner_only_under_the_data_directory(
    api: Client, session: Any, data_dir: Path, allowed_root: Path
) -> None:
    response = upload(api, session.pk, "shot.png", PNG, "image/png")

    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == {"id", "name", "mime_type", "size"}
    assert (body["name"], body["mime_type"], body["size"]) == ("shot.png", "image/png", len(PNG))
    path = stored_file(data_dir, body["id"])
    assert path.read_bytes() == PNG
    assert path.is_relative_to(data_dir / "attachments") and not path.is_relative_to(allowed_root)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"


def test_the_type_comes_from_the_content_not_the_client(api: Client, session: Any) -> None:
    disguised = upload(api, session.pk, "notes.txt", PNG, "text/plain").json()
    text = upload(api, session.pk, "main.py", "print('héllo')\n".encode(), "image/png").json()

    assert disguised["mime_type"] == "image/png"
    assert text["mime_type"] == "text/x-python"


@pytest.mark.parametrize("data", [b"\x00\x01\x02binary", b"\xff\xfe not utf-8", b"%PDF-1.7\n\x00\x00"])
def test_content_that_is_neither_an_image_nor_text_is_refused(
    api: Client, session: Any, data: bytes, data_dir: Path
) -> None:
    response = upload(api, session.pk, "blob.bin", data)

    assert response.status_code == 422
    assert response.json()["code"] == "unsupported_attachment"
    assert not Attachment.objects.exists()
    assert not [p for p in (data_dir / "attachments").rglob("*") if p.is_file()]


def test_a_file_past_the_limit_is_refused_and_nothing_is_kept(
    api: Client, session: Any, settings: Any, data_dir: Path
) -> None:
    settings.HERMESWEB_ATTACHMENT_MAX_BYTES = len(PNG) - 1

    response = upload(api, session.pk, "shot.png", PNG, "image/png")

    assert response.status_code == 413
    assert response.json()["code"] == "attachment_too_large"
    assert not Attachment.objects.exists()
    assert not [p for p in (data_dir / "attachments").rglob("*") if p.is_file()]
    settings.HERMESWEB_ATTACHMENT_MAX_BYTES = len(PNG)
    assert upload(api, session.pk, "shot.png", PNG, "image/png").status_code == 201


def test_an_image_is_refused_when_the_sessions_agent_takes_no_images(api: Client, session: Any) -> None:
    agent = session.project.agent
    Runner.objects.create(
        id="r1", host="h", pid=1, agent_capabilities={agent: {"prompt_capabilities": {"image": False}}}
    )

    refused = upload(api, session.pk, "shot.png", PNG, "image/png")
    text = upload(api, session.pk, "notes.md", b"# notes\n", "text/markdown")

    assert refused.status_code == 422 and refused.json()["code"] == "unsupported_attachment"
    assert text.status_code == 201  # text always goes: as a resource, or inline
    Runner.objects.filter(pk="r1").update(
        agent_capabilities={agent: {"prompt_capabilities": {"image": True}}}
    )
    assert upload(api, session.pk, "shot.png", PNG, "image/png").status_code == 201


def test_nobody_uploads_to_another_users_session(session: Any, other_user: Any) -> None:
    intruder = Client()
    intruder.force_login(other_user)

    response = upload(intruder, session.pk, "shot.png", PNG, "image/png")

    assert response.status_code == 404 and response.json()["code"] == "not_found"
    assert not Attachment.objects.exists()


# ---------------------------------------------------------------- content


def test_the_content_is_served_to_its_owner_only_with_safe_headers(
    api: Client, session: Any, other_user: Any
) -> None:
    image = upload(api, session.pk, "shot.png", PNG, "image/png").json()
    page = upload(api, session.pk, "page.html", b"<script>alert(1)</script>", "text/html").json()

    response = api.get(f"/api/attachments/{image['id']}/content")
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == PNG
    assert response["Content-Type"] == "image/png"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert (
        response["Content-Disposition"].startswith("inline") and "shot.png" in response["Content-Disposition"]
    )
    served = api.get(f"/api/attachments/{page['id']}/content")
    assert served["Content-Type"] == "text/plain; charset=utf-8"  # never HTML from this origin
    assert served["Content-Disposition"].startswith("attachment")

    intruder = Client()
    intruder.force_login(other_user)
    assert intruder.get(f"/api/attachments/{image['id']}/content").status_code == 404
    assert Client().get(f"/api/attachments/{image['id']}/content").status_code == 401


def test_the_file_is_removed_with_its_session(
    api: Client, session: Any, data_dir: Path, django_capture_on_commit_callbacks: Any
) -> None:
    attachment_id = upload(api, session.pk, "shot.png", PNG, "image/png").json()["id"]
    path = stored_file(data_dir, attachment_id)

    with django_capture_on_commit_callbacks(execute=True):
        session.delete()

    assert not Attachment.objects.filter(pk=attachment_id).exists()
    assert not path.exists() and not path.parent.exists()


# ---------------------------------------------------------------- messages


def test_a_message_carries_its_sessions_uploads_by_id(api: Client, session: Any) -> None:
    first = upload(api, session.pk, "shot.png", PNG, "image/png").json()
    second = upload(api, session.pk, "notes.txt", b"remember this\n").json()

    response = send(api, session.pk, "look at these", [second["id"], first["id"]])

    assert response.status_code == 202, response.content
    run = Run.objects.get(pk=response.json()["run_id"])
    assert run.attachments == [second, first]
    turn = api.get(f"/api/sessions/{session.pk}/transcript").json()["turns"][0]
    assert turn["attachments"] == [second, first]


def test_a_message_naming_another_sessions_or_users_upload_is_refused(
    api: Client, session: Any, project: Any, other_user: Any
) -> None:
    elsewhere = factories.SessionFactory(project=project)
    theirs = factories.SessionFactory(project=factories.ProjectFactory(owner=other_user))
    intruder = Client()
    intruder.force_login(other_user)
    other_session = upload(api, elsewhere.pk, "shot.png", PNG, "image/png").json()["id"]
    other_user_id = upload(intruder, theirs.pk, "shot.png", PNG, "image/png").json()["id"]

    for attachment_id in (other_session, other_user_id, 2**62):
        response = send(api, session.pk, "look", [attachment_id])
        assert response.status_code == 404, response.content
        assert response.json() == {"code": "not_found", "message": "No such attachment."}
    assert not Run.objects.filter(session=session).exists()


def test_a_message_sent_while_a_run_is_active_queues_with_its_attachments_even_as_steer(
    api: Client, session: Any
) -> None:
    factories.RunFactory(session=session, status=RunStatus.RUNNING)
    image = upload(api, session.pk, "shot.png", PNG, "image/png").json()

    response = send(api, session.pk, "and this", [image["id"]], mode="steer")

    assert response.status_code == 202
    assert response.json()["kind"] == "queue"
    intent = PendingIntent.objects.get(pk=response.json()["intent_id"])
    assert intent.attachments == [image]
    assert intent.reason  # why it did not steer, shown on the queued item


@pytest.mark.django_db(transaction=True)
def test_a_socket_submit_carries_attachments_by_the_same_rules(live: LiveStack) -> None:
    live.start_daphne()
    session = factories.SessionFactory()
    elsewhere = factories.SessionFactory(project=session.project)
    mine, theirs = (
        Attachment.objects.create(
            session=owner, name="shot.png", mime_type="image/png", size=3, sha256="0" * 64, path="unused"
        )
        for owner in (session, elsewhere)
    )
    socket = live.socket(session.pk, session_cookie(session.project.owner))

    socket.send(type="submit", client_id="other", text="look", attachments=[theirs.pk])
    socket.send(type="submit", client_id="mine", text="look", attachments=[mine.pk])

    refused = socket.until(lambda f: f["type"] == "submitted" and f["client_id"] == "other")[-1]
    assert (refused["error"]["status"], refused["error"]["code"]) == (404, "not_found")
    sent = socket.until(lambda f: f["type"] == "submitted" and f["client_id"] == "mine")[-1]
    run = Run.objects.get(pk=sent["result"]["run_id"])
    assert run.attachments == [mine.described()]


# ---------------------------------------------------------------- prompt blocks


FILES = [
    AttachmentFile(1, "shot.png", "image/png", PNG),
    AttachmentFile(2, "notes.txt", "text/plain", b"remember this\n"),
]


def test_images_go_as_image_blocks_and_text_as_resources_before_the_prompt() -> None:
    blocks = content_blocks("look", FILES, {"image": True, "embeddedContext": True})

    image, resource, text = blocks
    assert isinstance(image, schema.ImageContentBlock)
    assert (base64.b64decode(image.data), image.mime_type) == (PNG, "image/png")
    assert isinstance(resource, schema.EmbeddedResourceContentBlock)
    assert (resource.resource.text, resource.resource.mime_type) == ("remember this\n", "text/plain")
    assert resource.resource.uri.endswith("/notes.txt")
    assert isinstance(text, schema.TextContentBlock) and text.text == "look"


def test_without_embedded_context_a_text_file_goes_as_a_text_block_naming_it() -> None:
    blocks = content_blocks("look", FILES, {"image": True})

    assert isinstance(blocks[1], schema.TextContentBlock)
    assert (
        blocks[1].text.startswith("Attached file notes.txt (text/plain)")
        and "remember this" in blocks[1].text
    )
    assert blocks[2].text == "look"


def test_an_image_the_agent_no_longer_takes_is_named_not_sent() -> None:
    blocks = content_blocks("look", FILES[:1], {})

    assert [type(block) for block in blocks] == [schema.TextContentBlock, schema.TextContentBlock]
    assert "shot.png not sent" in blocks[0].text


@pytest.mark.django_db(transaction=True)
def test_the_demo_agent_acknowledges_the_attachments_it_received(
    api: Client, runners: list[Proc], logs: Path
) -> None:
    session = factories.SessionFactory(project__owner=factories.UserFactory(), project__agent="demo")
    api.force_login(session.project.owner)
    runner = start_runner(logs, "r1", HERMESWEB_DEMO_DELAY="0.005")
    runners.append(runner)
    image = upload(api, session.pk, "dot.png", PNG, "image/png").json()
    notes = upload(api, session.pk, "notes.txt", b"remember this\n").json()

    response = send(api, session.pk, "fast what did I send", [image["id"], notes["id"]])

    run = wait_status(Run.objects.get(pk=response.json()["run_id"]), RunStatus.COMPLETED, log=runner.log)
    text = state(run)["text"]
    assert f"Received image dot.png (image/png, {len(PNG)} bytes)." in text
    assert "Received file notes.txt (text/plain, 14 bytes)." in text
    assert "You said" in text and "what did I send" in text  # the prompt text still reached it


def test_the_attachments_directory_is_not_world_readable(api: Client, session: Any, data_dir: Path) -> None:
    upload(api, session.pk, "shot.png", PNG, "image/png")

    for folder in [p for p in (data_dir / "attachments").rglob("*") if p.is_dir()]:
        assert not os.stat(folder).st_mode & 0o077, folder
