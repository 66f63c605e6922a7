"""Rewind a turn's files and undo it: POST /api/runs/{id}/rewind, POST /api/checkpoints/{id}/restore.

Three shell turns through a real runner change, delete, add and re-mode files; rewinding the
last, then the first, puts back exact bytes (a deleted binary file, an executable bit), and the
undo puts the rewound state back. A file changed since by something else is a conflict unless
forced; a busy session refuses; a client_id is answered once. docs/workspace.md.
"""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from tests import factories
from tests.support.procs import Proc, wait_for
from tests.support.runs import run_of, submit, wait_status
from tests.support.workspace import restore, rewind, shell, shell_runner, turn
from workspace.models import Checkpoint

pytestmark = pytest.mark.django_db(transaction=True)

BLOB = bytes(range(256)) * 3 + b"\r\n\x00end"


@pytest.fixture
def session(user: Any) -> Any:
    return factories.SessionFactory(project=factories.ProjectFactory(owner=user, agent="demo"))


def tree(project: Path) -> dict[str, tuple[bytes, bool]]:
    """Every file under the project: its bytes and whether it is executable."""
    out = {}
    for path in sorted(project.rglob("*")):
        if path.is_file() and ".git" not in path.parts:
            out[str(path.relative_to(project))] = (
                path.read_bytes(),
                bool(path.stat().st_mode & stat.S_IXUSR),
            )
    return out


def test_rewinding_the_last_then_the_first_of_three_turns_restores_exact_bytes_and_undo_puts_them_back(
    runners: list[Proc], logs: Path, session: Any, api: Client
) -> None:
    runner = shell_runner(runners, logs)
    project = Path(session.project.path)
    (project / "a.txt").write_text("zero\n")
    (project / "gone.bin").write_bytes(BLOB)
    (project / "tool.sh").write_text("#!/bin/sh\necho hi\n")
    (project / "tool.sh").chmod(0o755)
    before_all = tree(project)

    first = shell(session, "printf 'one\\n' > a.txt && rm gone.bin", runner)
    shell(session, "printf 'two\\n' >> a.txt && chmod -x tool.sh", runner)
    after_two = tree(project)
    third = shell(
        session, "printf 'three\\n' > a.txt && echo new > added.txt && mkdir d && echo x > d/deep.txt", runner
    )
    after_three = tree(project)

    response = rewind(api, third.pk)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "accepted" and sorted(body["restored"]) == ["a.txt", "added.txt", "d/deep.txt"]
    assert tree(project) == after_two
    assert not (project / "d").exists()  # emptied directories go with their files

    response = rewind(api, first.pk)
    assert response.status_code == 200, response.content
    undo = response.json()["undo"]
    assert sorted(response.json()["restored"]) == ["a.txt", "gone.bin", "tool.sh"]
    assert tree(project) == before_all  # the deleted binary back byte for byte, tool.sh executable again
    assert (project / "gone.bin").read_bytes() == BLOB
    assert os.stat(project / "tool.sh").st_mode & 0o111

    response = restore(api, undo)
    assert response.status_code == 200, response.content
    assert tree(project) == after_two  # undo: the state the rewind replaced
    assert Checkpoint.objects.get(pk=undo).kind == "rewind"

    # The undo of the first rewind can itself be undone.
    response = restore(api, response.json()["undo"])
    assert response.status_code == 200 and tree(project) == before_all
    assert after_three != before_all


def test_a_file_changed_since_is_a_conflict_unless_forced_and_a_client_id_is_answered_once(
    runners: list[Proc], logs: Path, session: Any, api: Client
) -> None:
    runner = shell_runner(runners, logs)
    project = Path(session.project.path)
    (project / "a.txt").write_text("mine\n")
    run = shell(session, "echo agent > a.txt && echo b > b.txt", runner)
    (project / "a.txt").write_text("edited in my editor\n")  # outside the session

    response = rewind(api, run.pk)
    assert response.status_code == 409
    assert response.json()["code"] == "rewind_conflict" and response.json()["details"] == {"paths": ["a.txt"]}
    assert (project / "a.txt").read_text() == "edited in my editor\n" and (project / "b.txt").exists()

    client_id = uuid.uuid4().hex
    forced = rewind(api, run.pk, force=True, client_id=client_id)
    assert forced.status_code == 200 and forced.json()["status"] == "accepted"
    assert (project / "a.txt").read_text() == "mine\n" and not (project / "b.txt").exists()
    (project / "c.txt").write_text("after\n")
    again = rewind(api, run.pk, force=True, client_id=client_id)
    assert again.status_code == 200
    assert again.json() == {**forced.json(), "status": "duplicate"}
    # The edit that was overwritten is not lost: the undo holds it.
    assert restore(api, forced.json()["undo"]).status_code == 200
    assert (project / "a.txt").read_text() == "edited in my editor\n"


def test_a_session_with_an_active_run_refuses_to_rewind(
    runners: list[Proc], logs: Path, session: Any, api: Client
) -> None:
    runner = shell_runner(runners, logs)
    project = Path(session.project.path)
    first = shell(session, "echo one > one.txt", runner)
    held = run_of(submit(session, "shell echo x > x.txt; while [ ! -e go ]; do sleep 0.02; done; rm -f go"))
    wait_for(lambda: (project / "x.txt").exists(), 60, what="the held turn to write")

    response = rewind(api, first.pk)
    assert response.status_code == 409 and response.json()["code"] == "session_busy"
    assert (project / "one.txt").exists()
    (project / "go").touch()
    wait_status(held, "completed", timeout=60, log=runner.log)
    assert rewind(api, first.pk).status_code == 200
    assert not (project / "one.txt").exists() and not (project / "x.txt").exists()


def test_another_users_run_and_checkpoint_are_not_found(api: Client, other_user: Any) -> None:
    theirs = factories.SessionFactory(project=factories.ProjectFactory(owner=other_user))
    run = factories.run_with_events([("run.started", {"status": "running"})], session=theirs)
    checkpoint = Checkpoint.objects.create(
        project=theirs.project,
        session=theirs,
        run=run,
        kind="start",
        tree="4b825dc642cb6eb9a060e54bf8d69288fbee4904",
    )
    assert rewind(api, run.pk).status_code == 404
    assert restore(api, checkpoint.pk).status_code == 404


def test_the_agent_is_told_on_its_next_prompt_that_files_were_restored(
    runners: list[Proc], logs: Path, session: Any, api: Client
) -> None:
    from tests.support.runs import state

    runner = shell_runner(runners, logs)
    first = shell(session, "echo draft > notes.txt", runner)
    assert rewind(api, first.pk).status_code == 200

    told = turn(session, "hello fast", runner)
    text = state(told)["text"]  # the demo agent quotes its whole prompt back
    assert "restored files in the project" in text and "notes.txt" in text, text
    assert text.index("restored files") < text.index("hello fast")  # before the user's words
    again = turn(session, "hello again fast", runner)
    assert "restored files" not in state(again)["text"]  # said once


def test_a_symlink_the_agent_planted_is_replaced_never_written_through(
    api: Client, session: Any, tmp_path: Path
) -> None:
    from runs.models import RunStatus
    from workspace.services import record_checkpoint
    from workspace.store import Store

    project = Path(session.project.path)
    outside = tmp_path / "outside.txt"
    outside.write_text("not the project's\n")
    (project / "a.txt").write_text("original\n")
    run = factories.run_with_events(
        [("run.started", {"status": "running"}), ("done", {"state": "completed"})],
        session=session,
        status=RunStatus.RUNNING,
    )
    store = Store(session.project.pk, project)
    ids = {"run_id": run.pk, "session_id": session.pk, "project_id": session.project.pk}
    record_checkpoint(**ids, kind="start", snapshot=store.snapshot())
    (project / "a.txt").unlink()
    (project / "a.txt").symlink_to(outside)  # what a hostile agent leaves for the root web process
    record_checkpoint(**ids, kind="end", snapshot=store.snapshot())

    response = rewind(api, run.pk)
    assert response.status_code == 200 and response.json()["restored"] == ["a.txt"]
    assert not (project / "a.txt").is_symlink() and (project / "a.txt").read_text() == "original\n"
    assert outside.read_text() == "not the project's\n"
    assert restore(api, response.json()["undo"]).status_code == 200
    assert (project / "a.txt").is_symlink() and os.readlink(project / "a.txt") == str(outside)
    assert outside.read_text() == "not the project's\n"
