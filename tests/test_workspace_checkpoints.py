"""Checkpoints: the runner snapshots the project's tree at each run's start and end (issue 40).

The store is git's object store kept privately per project in the data directory
(workspace/store.py): the project's own repository is never touched, a project that is no
repository works the same, what .gitignore ignores and files over the size cap are left out,
and a tree over the caps turns checkpoints off with a notice, never a failed turn. The store is
hidden from a sandboxed agent. docs/workspace.md.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from runs.models import EventType, JournalEvent, RunStatus
from tests import factories
from tests.support.procs import Proc
from tests.support.workspace import SANDBOX, shell, shell_runner, turn
from workspace.models import Checkpoint, ProjectCheckpoints
from workspace.store import Store

pytestmark = pytest.mark.django_db(transaction=True)


def git(project: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "safe.directory=*", *args], cwd=project, capture_output=True, text=True, check=True
    ).stdout


def repository_state(project: Path) -> dict[str, Any]:
    """What of the project's own repository a checkpoint must leave alone."""
    dot_git = project / ".git"
    return {
        "index": hashlib.sha256((dot_git / "index").read_bytes()).hexdigest(),
        "head": git(project, "rev-parse", "HEAD"),
        "branches": git(project, "branch", "--list"),
        "stash": git(project, "stash", "list"),
        "status": git(project, "status", "--porcelain"),
    }


@pytest.fixture
def session(user: Any) -> Any:
    return factories.SessionFactory(project=factories.ProjectFactory(owner=user, agent="demo"))


# ---------------------------------------------------------------- the store alone


def test_a_snapshot_keeps_exact_bytes_modes_and_links_and_leaves_out_what_it_should(
    tmp_path: Path, settings: Any
) -> None:
    settings.HERMESWEB_CHECKPOINT_MAX_FILE_BYTES = 1000
    project = tmp_path / "plain"  # no repository at all
    (project / "bin").mkdir(parents=True)
    (project / "crlf.txt").write_bytes(b"one\r\ntwo\n")
    (project / ".gitattributes").write_text("* text eol=lf\n")  # would convert: must not
    (project / "bin" / "tool").write_text("#!/bin/sh\n")
    (project / "bin" / "tool").chmod(0o755)
    (project / "link").symlink_to("crlf.txt")
    (project / ".gitignore").write_text("*.log\n")
    (project / "debug.log").write_text("ignored\n")
    (project / "node_modules").mkdir()
    (project / "node_modules" / "dep.js").write_text("excluded by the operator's list\n")
    (project / "big.bin").write_bytes(os.urandom(2000))

    store = Store(10**9, project)
    store.remove()
    try:
        snapshot = store.snapshot()
        entries = store.entries(snapshot.tree)
        assert set(entries) == {"crlf.txt", ".gitattributes", "bin/tool", "link", ".gitignore"}
        assert snapshot.not_checkpointed == ["big.bin"]
        assert entries["bin/tool"].mode == "100755" and entries["link"].mode == "120000"
        blobs = store.blobs([entries["crlf.txt"].sha, entries["link"].sha])
        assert blobs[entries["crlf.txt"].sha] == b"one\r\ntwo\n"
        assert blobs[entries["link"].sha] == b"crlf.txt"
        # Unchanged: the same tree; the store lies in the data directory, the project holds nothing new.
        assert store.snapshot().tree == snapshot.tree
        assert store.git_dir.is_relative_to(Path(settings.DATA_DIR))
        assert not (project / ".git").exists()
    finally:
        store.remove()


def test_a_tree_over_the_caps_is_refused_before_anything_is_written(tmp_path: Path, settings: Any) -> None:
    from workspace.store import TooLarge

    settings.HERMESWEB_CHECKPOINT_MAX_FILES = 3
    for i in range(5):
        (tmp_path / f"f{i}.txt").write_text(f"{i}\n")
    store = Store(10**9 + 1, tmp_path)
    store.remove()
    try:
        with pytest.raises(TooLarge):
            store.snapshot()
    finally:
        store.remove()


# ---------------------------------------------------------------- through a real runner


def test_each_run_gets_a_start_and_an_end_checkpoint_and_the_projects_repository_is_untouched(
    runners: list[Proc], logs: Path, session: Any
) -> None:
    runner = shell_runner(runners, logs, HERMESWEB_CHECKPOINT_MAX_FILE_BYTES="1000")
    project = Path(session.project.path)
    git(project, "init", "-q", "-b", "main")
    (project / "tracked.txt").write_text("tracked\n")
    (project / "big.bin").write_bytes(os.urandom(5000))
    git(project, "add", "tracked.txt")
    git(project, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "first")
    (project / "tracked.txt").write_text("tracked, edited\n")
    git(project, "stash", "-q")
    (project / "staged.txt").write_text("staged\n")
    git(project, "add", "staged.txt")
    before = repository_state(project)

    run = shell(session, "echo made > by-shell.txt", runner)

    start, end = (Checkpoint.objects.of_run(run.pk, kind) for kind in ("start", "end"))
    assert start is not None and end is not None, runner.log()
    assert start.tree != end.tree
    assert start.stats["not_checkpointed"] == ["big.bin"]
    done = JournalEvent.objects.get(run=run, type=EventType.DONE)
    assert end.created_at <= done.created_at  # the end is recorded before the terminal event
    # git run by root on files the agent account owns: the repository is as it was, save the new file.
    after = repository_state(project)
    assert {k: v for k, v in after.items() if k != "status"} == {
        k: v for k, v in before.items() if k != "status"
    }
    assert after["status"] == before["status"] + "?? by-shell.txt\n"


@pytest.mark.skipif(SANDBOX != "auto", reason="the sandbox needs bubblewrap")
def test_the_checkpoint_store_is_hidden_from_the_sandboxed_agent(
    runners: list[Proc], logs: Path, session: Any
) -> None:
    runner = shell_runner(runners, logs)
    shell(session, "echo first > a.txt", runner)  # the store exists now
    store = Path(settings.DATA_DIR) / "checkpoints" / f"{session.project.pk}.git"
    assert (store / "HEAD").exists()
    probe = (
        f'if cat "{store}/HEAD" >/dev/null 2>&1; then echo store=read; else echo store=hidden; fi; '
        f'if touch "{store}/planted" 2>/dev/null; then echo write=done; else echo write=refused; fi'
    )
    run = shell(session, probe, runner)
    output = " ".join(
        item.get("text", "")
        for event in JournalEvent.objects.filter(run=run, type="tool.updated")
        for item in event.payload.get("content") or []
    )
    assert "store=hidden" in output and "write=refused" in output, output
    assert not (store / "planted").exists()


def test_a_tree_over_the_caps_turns_checkpoints_off_with_a_notice_never_a_failed_turn(
    runners: list[Proc], logs: Path, session: Any, api: Client
) -> None:
    runner = shell_runner(runners, logs, HERMESWEB_CHECKPOINT_MAX_FILES="3")
    project = Path(session.project.path)
    for i in range(5):
        (project / f"f{i}.txt").write_text(f"{i}\n")

    run = turn(session, "shell echo more > f9.txt", runner, RunStatus.COMPLETED)

    assert not Checkpoint.objects.filter(run=run).exists()
    state = ProjectCheckpoints.objects.get(project=session.project)
    assert "checkpoints are off" in state.off_reason
    notices = [e.payload["text"] for e in JournalEvent.objects.filter(run=run, type=EventType.PROGRESS)]
    assert any("checkpoints are off" in text for text in notices), notices
    body = api.get(f"/api/runs/{run.pk}/changes").json()
    assert body["files"] == [] and "checkpoints are off" in body["notice"]
    # The next turn does not walk the tree again, nor say it again.
    second = shell(session, "echo again > f9.txt", runner)
    assert not JournalEvent.objects.filter(run=second, type=EventType.PROGRESS).exists()


def test_a_deleted_projects_store_goes_with_it(user: Any) -> None:
    project = factories.ProjectFactory(owner=user)
    (Path(project.path) / "a.txt").write_text("a\n")
    store = Store(project.pk, project.path)
    store.snapshot()
    assert store.exists()
    project.delete()
    assert not store.exists()


def test_the_console_counts_checkpoints_per_project_and_turns_them_back_on(
    staff_user: Any, user: Any
) -> None:
    from django.contrib.admin import helpers
    from django.contrib.auth.models import Permission

    session = factories.SessionFactory(project=factories.ProjectFactory(owner=user))
    for kind in ("start", "end"):
        Checkpoint.objects.create(project=session.project, session=session, kind=kind, tree="0" * 40)
    other = factories.SessionFactory(project=factories.ProjectFactory(owner=user))
    Checkpoint.objects.create(project=other.project, session=other, kind="start", tree="0" * 40)
    state = ProjectCheckpoints.objects.create(project=session.project, off_reason="over the caps")
    console = Client()
    console.force_login(staff_user)
    listing = console.get("/admin/workspace/checkpoint/")
    page_text = listing.content.decode()
    assert listing.status_code == 200 and f"{session.project.name} (2)" in page_text  # per project
    page = console.get("/admin/workspace/projectcheckpoints/")
    assert page.status_code == 200 and page.context["cl"].result_list[0].kept == 2

    staff_user.user_permissions.add(Permission.objects.get(codename="change_projectcheckpoints"))
    console.post(
        "/admin/workspace/projectcheckpoints/",
        {"action": "turn_on", helpers.ACTION_CHECKBOX_NAME: [state.pk], "index": 0},
    )
    state.refresh_from_db()
    assert state.off_reason == ""


def test_a_symlink_swapped_into_the_projects_path_never_checkpoints_what_it_points_to(tmp_path: Path) -> None:
    """A nested project's path is its enclosing project's agent's to change: git is run in the
    project opened without following links, never handed its path (workspace/store.py)."""
    from tests.test_workspace_files import Flipper
    from workspace.store import StoreError

    outer = tmp_path / "outer"
    nested = outer / "nested"
    nested.mkdir(parents=True)
    (nested / "mine.txt").write_text("mine\n")
    foreign = tmp_path / "other-users-project"
    foreign.mkdir()
    (foreign / "theirs.txt").write_text("private\n")
    store = Store(10**9 + 2, nested)
    store.remove()
    seen: set[str] = set()
    taken = refused = 0
    try:
        with Flipper(nested, foreign) as flipper:
            while taken < 3 and refused < 400:  # some refused (a link at that instant), some taken
                try:
                    seen |= set(store.entries(store.snapshot().tree))
                    taken += 1
                except StoreError:
                    refused += 1
        assert flipper.flips > 10 and taken, (flipper.flips, taken, refused)
        assert seen == {"mine.txt"}, seen
    finally:
        store.remove()
    (tmp_path / "linked").symlink_to(foreign)
    with pytest.raises(StoreError):  # a link for the project itself
        Store(10**9 + 3, tmp_path / "linked").snapshot()
