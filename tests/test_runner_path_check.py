"""The runner checks a project's directory again before it starts an agent there.

Issue 22 item 3; docs/security.md ("Between users' projects"). A path saved under older
rules, edited in the database, or saved overlapping another user's project at the same
instant passes the API's check once; the runner applies `validate_project_location` again
when it starts the project's agent (runs.runner.agents.place_agent). A refused path fails
the turn with `project_path_refused` and one terminal event, and no agent is started.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from projects.models import Project
from runs.agents import agent_state_dir
from runs.models import AgentJob, AgentJobKind, AgentJobState, RunStatus
from runs.runner.agents import ProjectPathRefused, place_agent
from tests import factories
from tests.support import ptree
from tests.support.procs import Proc, start_runner, wait_for
from tests.support.runs import assert_journal_well_formed, events, refreshed, run_of, submit, wait_status


def move(project: Any, path: Path | str) -> None:
    """Change the path behind the API's back (as an old row, or a raw UPDATE, would hold it)."""
    Project.objects.filter(pk=project.pk).update(path=str(path))
    project.refresh_from_db()


@pytest.mark.django_db
def test_a_valid_project_is_placed_in_its_owners_state_directory(project: Any) -> None:
    placement = place_agent(project.pk, project.path, "demo")
    assert placement.project == Path(project.path).resolve()
    assert placement.state_dir == agent_state_dir(settings.DATA_DIR, project.owner_id, "demo")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("where", "code"),
    [("outside", "path_outside_roots"), ("root", "path_is_root"), ("taken", "path_taken")],
)
def test_a_path_the_rules_refuse_now_is_refused(
    project: Any, other_user: Any, allowed_root: Path, tmp_path: Path, where: str, code: str
) -> None:
    if where == "outside":
        (tmp_path / "elsewhere").mkdir()
        move(project, tmp_path / "elsewhere")
    elif where == "root":
        move(project, allowed_root)
    else:
        theirs = factories.ProjectFactory(owner=other_user)
        move(project, Path(theirs.path) / "inside")
        (Path(theirs.path) / "inside").mkdir()
    with pytest.raises(ProjectPathRefused, match=code) as refused:
        place_agent(project.pk, project.path, "demo")
    assert refused.value.code == "project_path_refused"


@pytest.mark.django_db
def test_a_deleted_project_is_refused(project: Any) -> None:
    pk, path = project.pk, project.path
    project.delete()
    with pytest.raises(ProjectPathRefused, match="no longer exists"):
        place_agent(pk, path, "demo")


@pytest.fixture
def runner(runners: list[Proc], logs: Path) -> Proc:
    proc = start_runner(logs, "path-check", HERMESWEB_DEMO_DELAY="0.002")
    runners.append(proc)
    return proc


def started_agent(runner: Proc, project: Any) -> bool:
    """Whether this runner started an agent for `project` (its log; log files are shared by
    every test's runner, and project ids repeat across test databases)."""
    return f"started for project {project.pk} (pid" in runner.log()


@pytest.mark.timeout(90)
@pytest.mark.django_db(transaction=True)
def test_a_turn_in_a_refused_directory_fails_once_and_starts_no_agent(
    runner: Proc, user: Any, other_user: Any
) -> None:
    # Inside the runner's roots (so it claims the turn: docs/runner.md "Placement"), but over
    # another user's project. A path outside every root is never claimed: its turn waits.
    project = factories.ProjectFactory(owner=user, agent="demo")
    session = factories.SessionFactory(project=project)
    original = project.path
    theirs = factories.ProjectFactory(owner=other_user)
    inside = Path(theirs.path) / "inside"
    inside.mkdir()
    move(project, inside)

    run = run_of(submit(session, "fast hello"))
    wait_status(run, RunStatus.FAILED, log=runner.log)
    assert_journal_well_formed(run)
    [error] = [e for e in events(run) if e.type == "error"]
    assert error.payload["code"] == "project_path_refused"
    assert "path_taken" in error.payload["message"]
    done = events(run)[-1].payload
    assert done["state"] == "failed" and done["code"] == "project_path_refused"
    assert "path_taken" in refreshed(run).error
    assert not started_agent(runner, project) and not ptree.descendants(runner.pid)
    assert not list(inside.iterdir())

    # Back inside the roots, the next turn starts the agent.
    move(project, original)
    again = run_of(submit(session, "fast hello again"))
    wait_status(again, RunStatus.COMPLETED, log=runner.log)
    assert started_agent(runner, project)


@pytest.mark.timeout(90)
@pytest.mark.django_db(transaction=True)
def test_a_discovery_in_a_refused_directory_fails_with_the_same_code(
    runner: Proc, user: Any, other_user: Any
) -> None:
    theirs = factories.ProjectFactory(owner=other_user, agent="demo")
    mine = factories.ProjectFactory(owner=user, agent="demo")
    move(mine, theirs.path)  # saved over another user's project (the check raced, or was skipped)
    job = AgentJob.objects.create(project=mine, kind=AgentJobKind.LIST_SESSIONS)

    def finished() -> AgentJob | None:
        job.refresh_from_db()
        return job if job.state in (AgentJobState.DONE, AgentJobState.FAILED) else None

    wait_for(finished, 40, what="the discovery job")
    assert (job.state, job.error_code) == (AgentJobState.FAILED, "project_path_refused"), runner.log()
    assert "path_taken" in job.error
    assert not started_agent(runner, mine) and not ptree.descendants(runner.pid)
