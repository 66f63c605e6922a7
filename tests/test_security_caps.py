"""Per-user caps, tried as an attacker would (docs/security.md, "Limits"): open sockets across web
processes (4429), projects and sessions (409), attachment bytes (413), each refused with a
`code` while another user goes on unaffected; uploads no message named are removed after a day,
by the command and by the runner's housekeeping, and sent ones stay."""

from __future__ import annotations

import contextlib
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from hermesweb.models import OpenSocket
from projects.models import Project, Session
from runs.live import socket_quota
from runs.models import AgentJob, AgentJobKind, AgentJobState, Attachment
from tests import factories
from tests.support import procs
from tests.support.live import LiveStack, layer, live, session_cookie  # noqa: F401 - fixtures
from tests.support.procs import Proc, start_runner, wait_for

JSON = "application/json"
CLOSE_TOO_MANY_SOCKETS = 4429


@pytest.fixture(autouse=True)
def data_dir(tmp_path: Path, settings: Any) -> Path:
    """Each test's own data directory (a runner subprocess is handed the same one)."""
    settings.DATA_DIR = tmp_path / "data"
    settings.DATA_DIR.mkdir()
    return settings.DATA_DIR


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def refusal(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, response.content
    assert response.json()["code"] == code


# ---------------------------------------------------------------- projects and sessions


def create_project(client: Client, root: Path) -> Any:
    path = root / uuid.uuid4().hex[:8]
    path.mkdir()
    return client.post("/api/projects", {"name": path.name, "path": str(path)}, content_type=JSON)


@pytest.mark.django_db
def test_projects_past_the_cap_are_refused_409_too_many_projects_while_another_user_creates(
    user: Any, other_user: Any, allowed_root: Path, settings: Any
) -> None:
    settings.HERMESWEB_MAX_PROJECTS_PER_USER = 3
    attacker, bystander = signed_in(user), signed_in(other_user)

    answers = [create_project(attacker, allowed_root) for _ in range(5)]

    assert [a.status_code for a in answers] == [201, 201, 201, 409, 409]
    refusal(answers[3], 409, "too_many_projects")
    assert Project.objects.filter(owner=user).count() == 3
    assert create_project(bystander, allowed_root).status_code == 201


@pytest.mark.django_db
def test_sessions_past_the_cap_are_refused_409_too_many_sessions_by_every_way_one_is_made(
    user: Any, other_user: Any, settings: Any
) -> None:
    settings.HERMESWEB_MAX_SESSIONS_PER_USER = 3
    attacker = signed_in(user)
    # The cap is the user's, over all their projects.
    first, second = factories.ProjectFactory(owner=user), factories.ProjectFactory(owner=user)
    created = [
        attacker.post(f"/api/projects/{project.pk}/sessions", {"title": "s"}, content_type=JSON)
        for project in (first, second, first)
    ]
    assert [c.status_code for c in created] == [201, 201, 201]

    refusal(
        attacker.post(f"/api/projects/{second.pk}/sessions", {}, content_type=JSON), 409, "too_many_sessions"
    )
    workflow = factories.WorkflowFactory(project=first, prompt_template="Do {thing}")
    launched = attacker.post(
        f"/api/workflows/{workflow.pk}/launch", {"variables": {"thing": "it"}}, content_type=JSON
    )
    refusal(launched, 409, "too_many_sessions")
    parent = Session.objects.filter(project=first).first()
    assert parent is not None
    Session.objects.filter(pk=parent.pk).update(agent_session_id="agent-parent")
    factories.RunnerFactory(agent_capabilities={"demo": {"session_capabilities": {"fork": {}}}})
    refusal(attacker.post(f"/api/sessions/{parent.pk}/fork"), 409, "too_many_sessions")
    assert Session.objects.filter(project__owner=user).count() == 3
    bystander_project = factories.ProjectFactory(owner=other_user)
    answer = signed_in(other_user).post(
        f"/api/projects/{bystander_project.pk}/sessions", {}, content_type=JSON
    )
    assert answer.status_code == 201


@pytest.mark.django_db
def test_imports_asked_for_count_as_sessions_toward_the_cap(user: Any, settings: Any) -> None:
    settings.HERMESWEB_MAX_SESSIONS_PER_USER = 2
    project = factories.ProjectFactory(owner=user)
    factories.SessionFactory(project=project)
    listed = [{"agent_session_id": sid, "cwd": project.path} for sid in ("a-1", "a-2", "a-3")]
    AgentJob.objects.create(
        project=project,
        kind=AgentJobKind.LIST_SESSIONS,
        state=AgentJobState.DONE,
        result={"sessions": listed, "truncated": False},
        finished_at=timezone.now(),
    )
    attacker = signed_in(user)

    def ask(agent_session_id: str) -> Any:
        body = {"agent_session_id": agent_session_id}
        return attacker.post(f"/api/projects/{project.pk}/import", body, content_type=JSON)

    assert ask("a-1").status_code == 202  # one session held, one promised: the cap
    refusal(ask("a-2"), 409, "too_many_sessions")
    assert ask("a-1").status_code == 202  # the same request again is the same job, not a new session
    assert AgentJob.objects.filter(kind=AgentJobKind.IMPORT_SESSION).count() == 1


# ---------------------------------------------------------------- attachment bytes


def upload(client: Client, session_id: int, data: bytes) -> Any:
    file = SimpleUploadedFile("notes.txt", data, content_type="text/plain")
    return client.post(f"/api/sessions/{session_id}/attachments", {"file": file})


def stored_files(data_dir: Path) -> list[Path]:
    return sorted(p for p in (data_dir / "attachments").rglob("*") if p.is_file())


@pytest.mark.django_db
def test_attachments_past_the_users_byte_quota_are_refused_413_and_nothing_is_kept(
    user: Any, other_user: Any, data_dir: Path, settings: Any
) -> None:
    settings.HERMESWEB_MAX_ATTACHMENT_BYTES_PER_USER = 100
    attacker = signed_in(user)
    # Spread over two sessions: the quota is the user's.
    one, two = factories.SessionFactory(project__owner=user), factories.SessionFactory(project__owner=user)

    assert upload(attacker, one.pk, b"a" * 60).status_code == 201
    refusal(upload(attacker, two.pk, b"b" * 41), 413, "attachment_quota_exceeded")
    assert upload(attacker, two.pk, b"c" * 40).status_code == 201  # exactly the quota
    refusal(upload(attacker, one.pk, b"d"), 413, "attachment_quota_exceeded")

    assert sum(Attachment.objects.values_list("size", flat=True)) == 100
    assert [p.read_bytes()[:1] for p in stored_files(data_dir)] == sorted([b"a", b"c"])
    theirs = factories.SessionFactory(project__owner=other_user)
    assert upload(signed_in(other_user), theirs.pk, b"e" * 100).status_code == 201


# ---------------------------------------------------------------- unsent attachments


def aged(attachment_id: int, days: float) -> None:
    Attachment.objects.filter(pk=attachment_id).update(created_at=timezone.now() - timedelta(days=days))


def uploads_of_every_kind(user: Any) -> dict[str, int]:
    """An old upload never sent, an old one a message named, an old one a queued message named,
    and a fresh one not sent yet."""
    client = signed_in(user)
    session = factories.SessionFactory(project__owner=user)
    ids = {
        name: upload(client, session.pk, name.encode()).json()["id"] for name in ("unsent", "sent", "fresh")
    }
    sent = client.post(
        f"/api/sessions/{session.pk}/messages",
        {"client_id": "m1", "text": "look", "attachments": [ids["sent"]]},
        content_type=JSON,
    )
    assert sent.status_code == 202 and sent.json()["kind"] == "run", sent.content
    # That turn waits for a runner, so the next message waits behind it as an intent.
    ids["queued"] = upload(client, session.pk, b"queued").json()["id"]
    queued = client.post(
        f"/api/sessions/{session.pk}/messages",
        {"client_id": "m2", "text": "and this", "attachments": [ids["queued"]], "mode": "queue"},
        content_type=JSON,
    )
    assert queued.status_code == 202 and queued.json()["kind"] == "queue", queued.content
    for name in ("unsent", "sent", "queued"):
        aged(ids[name], days=2)
    return ids


@pytest.mark.django_db
def test_the_command_removes_an_old_unsent_upload_and_its_file_and_keeps_sent_and_fresh_ones(
    user: Any, data_dir: Path, django_capture_on_commit_callbacks: Any
) -> None:
    ids = uploads_of_every_kind(user)
    unsent_file = data_dir / Attachment.objects.get(pk=ids["unsent"]).path

    with django_capture_on_commit_callbacks(execute=True):
        call_command("remove_unsent_attachments", stdout=open("/dev/null", "w"))  # noqa: SIM115

    assert set(Attachment.objects.values_list("pk", flat=True)) == {ids["sent"], ids["queued"], ids["fresh"]}
    assert not unsent_file.exists()
    assert {p.read_bytes() for p in stored_files(data_dir)} == {b"sent", b"queued", b"fresh"}


@pytest.mark.django_db(transaction=True)
def test_a_runner_removes_old_unsent_uploads_in_its_housekeeping(
    user: Any, data_dir: Path, runners: list[Proc], logs: Path
) -> None:
    ids = uploads_of_every_kind(user)
    unsent_file = data_dir / Attachment.objects.get(pk=ids["unsent"]).path

    runners.append(start_runner(logs, "housekeeper"))

    wait_for(lambda: not unsent_file.exists(), 30, what="the runner to remove the unsent upload")
    assert not Attachment.objects.filter(pk=ids["unsent"]).exists()
    assert {p.read_bytes() for p in stored_files(data_dir)} == {b"sent", b"queued", b"fresh"}


@pytest.mark.django_db
def test_a_message_naming_an_upload_the_cleanup_removed_is_404_not_a_turn_without_it(user: Any) -> None:
    client = signed_in(user)
    session = factories.SessionFactory(project__owner=user)
    stale = upload(client, session.pk, b"old").json()["id"]
    aged(stale, days=2)
    call_command("remove_unsent_attachments", stdout=open("/dev/null", "w"))  # noqa: SIM115

    answer = client.post(
        f"/api/sessions/{session.pk}/messages",
        {"client_id": "late", "text": "here", "attachments": [stale]},
        content_type=JSON,
    )

    refusal(answer, 404, "not_found")
    assert not session.runs.exists()


# ---------------------------------------------------------------- sockets


def refused_with(ws: ClientConnection) -> int | None:
    """None if the socket was admitted (a ping is answered), else the code it was closed with."""
    try:
        ws.send('{"type": "ping"}')
        while True:
            if '"pong"' in str(ws.recv(timeout=30)):
                return None
    except ConnectionClosed as closed:
        assert closed.rcvd is not None, "closed without a close frame"
        return closed.rcvd.code


def open_socket(stack: contextlib.ExitStack, port: int, path: str, cookie: str) -> ClientConnection:
    ws = connect(
        f"ws://127.0.0.1:{port}{path}",
        origin=f"http://127.0.0.1:{port}",  # type: ignore[arg-type]
        additional_headers={"Cookie": f"sessionid={cookie}"},
        proxy=None,
        open_timeout=30,
    )
    return stack.enter_context(ws)


def test_sockets_past_the_cap_are_closed_4429_while_another_user_connects(live: LiveStack) -> None:
    port = live.start_daphne(HERMESWEB_MAX_SOCKETS_PER_USER="3")
    session = factories.SessionFactory()
    attacker, bystander = session.project.owner, factories.UserFactory()
    cookie = session_cookie(attacker)
    with contextlib.ExitStack() as stack:
        # Session sockets and the sessionless /ws/live/ count alike.
        held = [open_socket(stack, port, f"/ws/sessions/{session.pk}/", cookie) for _ in range(2)]
        held.append(open_socket(stack, port, "/ws/live/", cookie))
        assert [refused_with(ws) for ws in held] == [None, None, None]

        extra = [open_socket(stack, port, f"/ws/sessions/{session.pk}/", cookie) for _ in range(3)]
        assert [refused_with(ws) for ws in extra] == [CLOSE_TOO_MANY_SOCKETS] * 3
        assert refused_with(open_socket(stack, port, "/ws/live/", cookie)) == CLOSE_TOO_MANY_SOCKETS
        assert refused_with(open_socket(stack, port, "/ws/live/", session_cookie(bystander))) is None

        # A socket that closes gives its place back.
        held[0].close()
        wait_for(
            lambda: OpenSocket.objects.filter(user=attacker).count() == 2, what="the closed socket's row"
        )
        assert refused_with(open_socket(stack, port, f"/ws/sessions/{session.pk}/", cookie)) is None


def test_the_socket_cap_counts_a_users_sockets_on_every_web_process(live: LiveStack) -> None:
    first = live.start_daphne(HERMESWEB_MAX_SOCKETS_PER_USER="3")
    other, second = procs.start_daphne(live.log_dir, **live.env(HERMESWEB_MAX_SOCKETS_PER_USER="3"))
    live.procs.append(other)
    attacker = factories.UserFactory()
    cookie = session_cookie(attacker)
    with contextlib.ExitStack() as stack:
        held = [open_socket(stack, port, "/ws/live/", cookie) for port in (first, first, second)]
        assert [refused_with(ws) for ws in held] == [None, None, None]

        assert refused_with(open_socket(stack, second, "/ws/live/", cookie)) == CLOSE_TOO_MANY_SOCKETS
        assert refused_with(open_socket(stack, first, "/ws/live/", cookie)) == CLOSE_TOO_MANY_SOCKETS


@pytest.mark.django_db
def test_a_dead_processs_socket_rows_stop_counting_and_are_deleted(user: Any, settings: Any) -> None:
    settings.HERMESWEB_MAX_SOCKETS_PER_USER = 2
    gone = timezone.now() - timedelta(seconds=socket_quota.STALE_SECONDS + 1)
    for _ in range(2):
        OpenSocket.objects.create(user=user, process="dead", opened_at=gone, seen_at=gone)

    mine = [socket_quota.claim(user.pk) for _ in range(3)]
    socket_quota.refresh([row for row in mine if row is not None])

    assert mine[0] is not None and mine[1] is not None and mine[2] is None
    assert set(OpenSocket.objects.values_list("process", flat=True)) == {socket_quota.PROCESS}
