"""ACP's fs/read_text_file and fs/write_text_file, as the runner serves them (runs/runner/client_fs.py).

Issue 44 ("The client side of ACP"); docs/runner.md ("Client capabilities"). The demo agent's
`readfile` and `writefile` words call the client as a real agent's tools would; a relative path
is joined to the cwd as written, `..` included, so the escapes are tried through the protocol.
The symlink swapped in during a read is raced against the opener itself, thousands of times.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import acp
import pytest
from django.test import Client

from runs.models import RunStatus
from runs.runner.client_fs import ProjectFiles, read_text_file, select_lines, write_text_file
from tests import factories
from tests.support.procs import Proc
from tests.support.runs import (
    assert_journal_well_formed,
    events,
    run_of,
    state,
    submit,
    wait_event,
    wait_status,
)
from tests.support.workspace import changes, shell_runner, turn

JSON = "application/json"
NOT_FOUND = -32002  # ACP's resource_not_found: the one answer for every escape


def reply(run: Any) -> str:
    return state(run)["text"]


# ---------------------------------------------------------------- pure parts


def test_line_and_limit_select_one_based_lines_with_their_endings() -> None:
    text = "one\ntwo\nthree\nfour"
    assert select_lines(text, None, None) == text
    assert select_lines(text, 2, 2) == "two\nthree\n"
    assert select_lines(text, 3, None) == "three\nfour"
    assert select_lines(text, None, 1) == "one\n"
    assert select_lines(text, 9, 2) == ""


def test_paths_outside_the_project_are_not_found_however_they_are_spelled(tmp_path: Path) -> None:
    project = tmp_path / "p"
    project.mkdir()
    files = ProjectFiles(project)
    for path in (
        f"{project}/../secret",
        f"{project}/a/../../secret",
        "/etc/passwd",
        f"{project}2/x",  # a sibling sharing the prefix
        "relative.txt",
        f"{project}/a\x00b",
        str(project),
    ):
        with pytest.raises(acp.RequestError) as caught:
            files.relative(path)
        assert caught.value.code == NOT_FOUND, path
    assert files.relative(f"{project}/a/b.txt") == "a/b.txt"


def test_a_write_needs_a_running_turn_that_is_not_stopping(tmp_path: Path) -> None:
    files = ProjectFiles(tmp_path)
    target = f"{tmp_path}/new.txt"
    with pytest.raises(acp.RequestError):
        asyncio.run(write_text_file(files, None, target, "x"))

    class Stopping:
        cancel_requested = threading.Event()

    Stopping.cancel_requested.set()
    with pytest.raises(acp.RequestError):
        asyncio.run(write_text_file(files, Stopping(), target, "x"))
    assert not (tmp_path / "new.txt").exists()


def test_a_symlink_swapped_in_during_reads_never_lets_one_out(tmp_path: Path) -> None:
    """An attacker's agent swaps `dir` between a real directory and a link to another user's
    files while the client reads `dir/f` over and over: each read is the project's file or not
    found, never the other user's."""
    project, outside = tmp_path / "project", tmp_path / "theirs"
    (project / "dir").mkdir(parents=True)
    (project / "dir" / "f").write_text("mine\n")
    outside.mkdir()
    (outside / "f").write_text("THEIRS\n")
    (project / "link").symlink_to(outside)
    stop = threading.Event()

    def swap() -> None:
        # rename(2) over the name: at every instant `dir` is one or the other.
        while not stop.is_set():
            os.rename(project / "dir", project / "real")
            os.rename(project / "link", project / "dir")
            os.rename(project / "dir", project / "link")
            os.rename(project / "real", project / "dir")

    files = ProjectFiles(project)
    seen: dict[str, int] = {}

    async def reads() -> None:
        for _ in range(3000):
            try:
                content = (await read_text_file(files, f"{project}/dir/f", None, None)).content
            except acp.RequestError as exc:
                assert exc.code == NOT_FOUND
                content = "not found"
            seen[content] = seen.get(content, 0) + 1

    swapper = threading.Thread(target=swap)
    swapper.start()
    try:
        asyncio.run(reads())
    finally:
        stop.set()
        swapper.join()
    assert "THEIRS\n" not in seen, seen
    assert seen.get("mine\n"), seen
    # And a link standing still is refused outright.
    with pytest.raises(acp.RequestError):
        asyncio.run(read_text_file(files, f"{project}/link/f", None, None))


# ---------------------------------------------------------------- through a real agent


@pytest.fixture
def runner(runners: list[Proc], logs: Path) -> Proc:
    return shell_runner(runners, logs, "client-fs")


@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_the_agent_reads_its_project_through_the_client_with_line_and_limit(runner: Proc, user: Any) -> None:
    project = factories.ProjectFactory(owner=user, agent="demo")
    (Path(project.path) / "notes.txt").write_text("alpha\nbeta\ngamma\ndelta\n")
    session = factories.SessionFactory(project=project)

    whole = turn(session, "readfile notes.txt", runner)
    assert "read 23 chars" in reply(whole) and "alpha\nbeta\ngamma\ndelta" in reply(whole)
    part = turn(session, "readfile notes.txt line 2 limit 2", runner)
    assert "read 11 chars:\n\n```\nbeta\ngamma\n```" in reply(part)
    card = next(e for e in events(part) if e.type == "tool.updated" and e.payload.get("content"))
    assert card.payload["content"][0]["text"] == "beta\ngamma\n"
    assert_journal_well_formed(part)


@pytest.mark.timeout(150)
@pytest.mark.django_db(transaction=True)
def test_escapes_through_the_client_are_not_found(
    runner: Proc, user: Any, other_user: Any, tmp_path: Path
) -> None:
    project = factories.ProjectFactory(owner=user, agent="demo")
    theirs = factories.ProjectFactory(owner=other_user, agent="demo")
    (Path(theirs.path) / "theirs.txt").write_text("private\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret\n")
    (Path(project.path) / "link").symlink_to(outside)
    session = factories.SessionFactory(project=project)
    relative_theirs = os.path.relpath(theirs.path, project.path)

    for prompt in (
        f"readfile {relative_theirs}/theirs.txt",  # `..` up and into another user's project
        f"readfile {theirs.path}/theirs.txt",  # the same, absolute
        "readfile /etc/hostname",
        "readfile link/secret.txt",  # a symlink in the project pointing out
    ):
        run = turn(session, prompt, runner)
        assert f"read refused: {NOT_FOUND}" in reply(run), (prompt, reply(run))
        assert "private" not in reply(run) and "secret\n" not in reply(run)

    # A write through the same doors (answered "allow" each time) lands nowhere.
    for prompt in (f"writefile {relative_theirs}/planted.txt x", "writefile link/planted.txt x"):
        run = run_of(submit(session, prompt))
        asked = wait_event(run, "approval.requested", timeout=60)
        answer(run, asked.payload["approval_id"], "allow_once", session.project.owner)
        wait_status(run, RunStatus.COMPLETED, RunStatus.FAILED, timeout=60, log=runner.log)
        assert f"write refused: {NOT_FOUND}" in reply(run), reply(run)
    assert not (Path(theirs.path) / "planted.txt").exists()
    assert not (outside / "planted.txt").exists()


def answer(run: Any, approval_id: str, option_id: str, owner: Any) -> None:
    client = Client()
    client.force_login(owner)
    response = client.post(
        f"/api/runs/{run.pk}/approvals/{approval_id}", {"option_id": option_id}, content_type=JSON
    )
    assert response.status_code == 200, response.content


@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_a_write_is_made_only_after_the_users_approval_and_the_workspace_sees_it(
    runner: Proc, user: Any, api: Client
) -> None:
    project = factories.ProjectFactory(owner=user, agent="demo")
    session = factories.SessionFactory(project=project)
    target = Path(project.path) / "docs" / "out.txt"

    denied = run_of(submit(session, "writefile docs/out.txt never written"))
    asked = wait_event(denied, "approval.requested", timeout=60)
    assert not target.exists()  # asking wrote nothing
    answer(denied, asked.payload["approval_id"], "deny", user)
    wait_status(denied, RunStatus.COMPLETED, RunStatus.FAILED, timeout=60, log=runner.log)
    assert "Denied: nothing written" in reply(denied) and not target.exists()

    run = run_of(submit(session, "writefile docs/out.txt hello from the client"))
    asked = wait_event(run, "approval.requested", timeout=60)
    answer(run, asked.payload["approval_id"], "allow_once", user)
    wait_status(run, RunStatus.COMPLETED, RunStatus.FAILED, timeout=60, log=runner.log)
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, reply(run)
    assert target.read_text() == "hello from the client\n"
    # Owned like the project (the agent account's when the runner is root), not the runner's.
    assert target.stat().st_uid == Path(project.path).stat().st_uid
    # The tool card shows the diff the agent reported; the turn's changes see the file.
    diffs = [
        c
        for e in events(run)
        if e.type.startswith("tool.")
        for c in e.payload.get("content") or []
        if c["type"] == "diff"
    ]
    assert diffs and diffs[0]["new_text"] == "hello from the client\n"
    body = changes(api, f"/api/runs/{run.pk}/changes")
    assert [f["path"] for f in body["files"]] == ["docs/out.txt"], body
    assert_journal_well_formed(run)
