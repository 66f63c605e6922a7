"""A run's and a session's changes: GET /api/runs/{id}/changes, GET /api/sessions/{id}/changes.

Whatever made the change — the agent's edit tool (through an approval) or a shell command the
ACP stream shows no diff for — it is in the run's changes, from its start checkpoint to its end
one; while the run is active, and after a runner crash, to the tree as it is now
(`complete: false`). docs/workspace.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from runs.controls import do_respond_approval
from runs.models import RunStatus
from tests import factories
from tests.support.procs import Proc, wait_for
from tests.support.runs import run_of, submit, wait_event, wait_status
from tests.support.workspace import by_path, changes, shell, shell_runner
from workspace.models import Checkpoint

pytestmark = pytest.mark.django_db(transaction=True)

# A shell turn that writes, then holds until the test creates `go` (then removes it).
HELD = "echo partial > partial.txt; while [ ! -e go ]; do sleep 0.02; done; rm -f go"


@pytest.fixture
def session(user: Any) -> Any:
    return factories.SessionFactory(project=factories.ProjectFactory(owner=user, agent="demo"))


def test_an_edit_through_a_tool_and_a_shell_made_change_both_show_in_their_runs_changes(
    runners: list[Proc], logs: Path, session: Any, api: Client
) -> None:
    runner = shell_runner(runners, logs)
    project = Path(session.project.path)
    (project / "notes.md").write_text("a\nb\nc\n")
    (project / "old.txt").write_text("old\n")

    edit = run_of(submit(session, "edit please"))
    request = wait_event(edit, "approval.requested", timeout=60)
    assert do_respond_approval(edit, request.payload["approval_id"], "allow_once").status == "accepted"
    wait_status(edit, RunStatus.COMPLETED, timeout=60, log=runner.log)
    command = shell(session, "sed -i 's/b/B/' notes.md && rm old.txt && printf 'x\\000y' > blob.bin", runner)

    first = changes(api, f"/api/runs/{edit.pk}/changes")
    assert first["complete"] is True and first["run_id"] == edit.pk
    edited = by_path(first)["demo-edit.txt"]
    assert (edited["status"], edited["additions"], edited["deletions"]) == ("added", 1, 0)
    assert "+Hello from the hermesweb demo agent." in edited["diff"]

    second = by_path(changes(api, f"/api/runs/{command.pk}/changes"))
    assert set(second) == {"notes.md", "old.txt", "blob.bin"}
    assert (
        second["notes.md"]["status"],
        second["notes.md"]["additions"],
        second["notes.md"]["deletions"],
    ) == (
        "modified",
        1,
        1,
    )
    assert "-b\n+B\n" in second["notes.md"]["diff"]
    assert second["old.txt"]["status"] == "deleted"
    assert second["blob.bin"]["binary"] is True and second["blob.bin"]["diff"] is None

    whole = changes(api, f"/api/sessions/{session.pk}/changes")
    assert whole["complete"] is True and whole["run_id"] == command.pk
    assert set(by_path(whole)) == {"demo-edit.txt", "notes.md", "old.txt", "blob.bin"}


def test_while_a_run_is_active_its_changes_run_to_now_and_are_not_complete(
    runners: list[Proc], logs: Path, session: Any, api: Client
) -> None:
    runner = shell_runner(runners, logs)
    run = run_of(submit(session, f"shell {HELD}"))
    project = Path(session.project.path)
    wait_for(lambda: (project / "partial.txt").exists(), 60, what="the turn to write")

    live = changes(api, f"/api/runs/{run.pk}/changes")
    assert live["complete"] is False and set(by_path(live)) == {"partial.txt"}
    assert changes(api, f"/api/sessions/{session.pk}/changes")["complete"] is False

    (project / "go").touch()
    wait_status(run, RunStatus.COMPLETED, timeout=60, log=runner.log)
    done = changes(api, f"/api/runs/{run.pk}/changes")
    assert done["complete"] is True and set(by_path(done)) == {"partial.txt"}


def test_a_runner_crash_mid_run_leaves_changes_against_the_tree_as_it_is(
    runners: list[Proc], logs: Path, session: Any, api: Client
) -> None:
    runner = shell_runner(runners, logs)
    run = run_of(submit(session, f"shell {HELD}"))
    project = Path(session.project.path)
    wait_for(lambda: (project / "partial.txt").exists(), 60, what="the turn to write")
    runner.kill9()  # the agent dies with it (its sandbox: --die-with-parent)

    assert Checkpoint.objects.of_run(run.pk, "start") is not None
    assert Checkpoint.objects.of_run(run.pk, "end") is None
    body = changes(api, f"/api/runs/{run.pk}/changes")
    assert body["complete"] is False and set(by_path(body)) == {"partial.txt"}
    (project / "later.txt").write_text("after the crash\n")
    assert set(by_path(changes(api, f"/api/runs/{run.pk}/changes"))) == {"partial.txt", "later.txt"}


def test_a_run_without_checkpoints_has_no_changes(api: Client, session: Any) -> None:
    run = factories.run_with_events(
        [("run.started", {"status": "running"}), ("done", {"state": "completed"})],
        session=session,
        status=RunStatus.RUNNING,
    )
    run.refresh_from_db()
    body = changes(api, f"/api/runs/{run.pk}/changes")
    assert body == {"run_id": run.pk, "complete": True, "files": [], "notice": None}
