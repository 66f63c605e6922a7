"""Fork: `POST /api/sessions/{id}/fork` copies the settled history; the first turn forks the agent.

The API half runs in-process; the runner half starts a real runner and the demo agent, whose
`recall` script shows what the agent session remembers (runs/demo_agent/scripts.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from projects.models import Session, SessionStatus
from runs import search
from runs.fork import do_fork_session
from runs.models import JournalEvent, Run, RunSource, RunStatus
from tests import factories
from tests.support.procs import Proc, start_runner
from tests.support.runs import assert_journal_well_formed, run_of, state, submit, wait_status

FORKABLE = {"demo": {"session_capabilities": {"fork": {}, "list": {}}}}


def fork_url(session: Any) -> str:
    return f"/api/sessions/{session.pk}/fork"


def journal_of(run: Run) -> list[tuple[int, str, dict[str, Any], bool]]:
    rows = JournalEvent.objects.filter(run=run).order_by("seq")
    return [(e.seq, e.type, e.payload, e.terminal) for e in rows]


@pytest.fixture
def parent(session: Any) -> Any:
    """A session with an agent session, two settled turns (one cancelled) and a runner that can fork."""
    Session.objects.filter(pk=session.pk).update(agent_session_id="agent-parent-1", title="Cache work")
    session.refresh_from_db()
    factories.run_with_events(
        [
            ("run.started", {"status": "running", "session_id": session.pk}),
            ("token.delta", {"message_id": "m0", "delta": "The cache is warm now."}),
            ("done", {"state": "completed", "stop_reason": "end_turn"}),
        ],
        session=session,
        prompt_text="Warm the cache",
        status=RunStatus.RUNNING,
    )
    factories.run_with_events(
        [
            ("run.started", {"status": "running", "session_id": session.pk}),
            ("tool.started", {"tool_call_id": "t1", "title": "Grep memoize", "status": "pending"}),
            ("done", {"state": "cancelled", "stop_reason": "cancelled"}),
        ],
        session=session,
        prompt_text="Now find memoize",
        status=RunStatus.RUNNING,
    )
    factories.RunnerFactory(agent_capabilities=FORKABLE)
    return session


@pytest.mark.django_db
def test_a_fork_is_a_new_session_with_the_parents_turns_and_events(
    api: Client, parent: Any, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(fork_url(parent))

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["id"] != parent.pk
    assert body["project_id"] == parent.project_id
    assert body["title"] == "Cache work (fork)"
    assert body["agent_session_id"] == ""
    assert body["active_run_id"] is None
    fork = Session.objects.get(pk=body["id"])
    assert fork.forked_from_id == parent.pk
    assert fork.fork_agent_session_id == "agent-parent-1"
    originals = list(Run.objects.filter(session=parent).order_by("created_at", "id"))
    copies = list(Run.objects.filter(session=fork).order_by("created_at", "id"))
    assert [c.prompt_text for c in copies] == [o.prompt_text for o in originals]
    assert [c.status for c in copies] == [RunStatus.COMPLETED, RunStatus.CANCELLED]
    for original, copy in zip(originals, copies, strict=True):
        assert copy.source == RunSource.IMPORT
        assert copy.source_meta == {"forked_from_run": original.pk, "forked_from_session": parent.pk}
        assert journal_of(copy) == journal_of(original)  # same seqs, types, payloads
        assert copy.last_seq == original.last_seq
        assert copy.finished_at is not None
    transcript = api.get(f"/api/sessions/{fork.pk}/transcript").json()
    items = transcript["turns"][0]["state"]["items"]
    assert "".join(i["text"] for i in items if i["kind"] == "text") == "The cache is warm now."
    # The copied turns are searchable as the fork's.
    hits = search.search(parent.project.owner, "warm").hits
    assert [(h.session_id, h.run_id) for h in hits] == [(fork.pk, copies[0].pk)]


@pytest.mark.django_db
def test_a_fork_leaves_the_parent_as_it_was(api: Client, parent: Any) -> None:
    before = [journal_of(r) for r in Run.objects.filter(session=parent).order_by("pk")]
    assert api.post(fork_url(parent)).status_code == 201
    parent.refresh_from_db()
    assert parent.agent_session_id == "agent-parent-1"
    assert parent.fork_agent_session_id == ""
    assert [journal_of(r) for r in Run.objects.filter(session=parent).order_by("pk")] == before


@pytest.mark.django_db
def test_forking_a_fork_that_has_not_run_forks_the_same_agent_session(api: Client, parent: Any) -> None:
    first = api.post(fork_url(parent)).json()
    second = api.post(f"/api/sessions/{first['id']}/fork")
    assert second.status_code == 201
    fork = Session.objects.get(pk=second.json()["id"])
    assert fork.fork_agent_session_id == "agent-parent-1"
    assert fork.title == "Cache work (fork) (fork)"
    assert Run.objects.filter(session=fork).count() == 2


@pytest.mark.django_db
def test_someone_elses_session_is_not_found(parent: Any, other_user: Any) -> None:
    client = Client()
    client.force_login(other_user)
    response = client.post(fork_url(parent))
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"
    assert Session.objects.count() == 1


@pytest.mark.django_db
def test_an_archived_session_is_refused(api: Client, parent: Any) -> None:
    Session.objects.filter(pk=parent.pk).update(status=SessionStatus.ARCHIVED)
    response = api.post(fork_url(parent))
    assert (response.status_code, response.json()["code"]) == (409, "session_archived")


@pytest.mark.django_db
def test_a_session_with_a_turn_running_is_busy(api: Client, parent: Any) -> None:
    factories.RunFactory(session=parent, status=RunStatus.RUNNING)
    response = api.post(fork_url(parent))
    assert (response.status_code, response.json()["code"]) == (409, "session_busy")
    assert Session.objects.count() == 1


@pytest.mark.django_db
def test_a_session_that_never_reached_its_agent_is_unsupported(api: Client, session: Any) -> None:
    factories.RunnerFactory(agent_capabilities=FORKABLE)
    response = api.post(fork_url(session))
    assert (response.status_code, response.json()["code"]) == (422, "unsupported")


@pytest.mark.django_db
def test_an_agent_that_does_not_advertise_fork_is_unsupported(api: Client, parent: Any) -> None:
    from runs.models import Runner

    Runner.objects.update(agent_capabilities={"demo": {"session_capabilities": {"list": {}}}})
    response = api.post(fork_url(parent))
    assert (response.status_code, response.json()["code"]) == (422, "unsupported")
    assert Session.objects.count() == 1


@pytest.mark.django_db
def test_without_a_live_runner_that_knows_the_agent_it_asks_to_try_again(api: Client, parent: Any) -> None:
    from runs.models import Runner

    Runner.objects.update(agent_capabilities={"hermes": FORKABLE["demo"]})
    response = api.post(fork_url(parent))
    assert (response.status_code, response.json()["code"]) == (422, "agent_unavailable")


# ---------------------------------------------------------------- the runner and the demo agent


@pytest.fixture
def runner(runners: list[Proc], logs: Path) -> Proc:
    proc = start_runner(logs, "fork-runner", HERMESWEB_DEMO_DELAY="0.005")
    runners.append(proc)
    return proc


@pytest.mark.django_db(transaction=True)
def test_the_forks_first_turn_remembers_the_parents_conversation(runner: Proc) -> None:
    parent = factories.SessionFactory(project__agent="demo")
    first = run_of(submit(parent, "fast remember the word PAPAYA-5151"))
    wait_status(first, RunStatus.COMPLETED, log=runner.log)
    parent.refresh_from_db()

    fork = do_fork_session(parent.project.owner, parent.pk)
    turn = run_of(submit(fork, "recall fast"))
    wait_status(turn, RunStatus.COMPLETED, log=runner.log)

    assert_journal_well_formed(turn)
    assert "Your previous prompt was: fast remember the word PAPAYA-5151" in state(turn)["text"]
    fork.refresh_from_db()
    assert fork.agent_session_id and fork.agent_session_id != parent.agent_session_id
    assert fork.fork_agent_session_id == ""
    # Two conversations from here on: the parent does not see the fork's turn.
    again = run_of(submit(parent, "recall fast"))
    wait_status(again, RunStatus.COMPLETED, log=runner.log)
    assert "Your previous prompt was: fast remember the word PAPAYA-5151" in state(again)["text"]
    later = run_of(submit(fork, "fast recall"))
    wait_status(later, RunStatus.COMPLETED, log=runner.log)
    assert "Your previous prompt was: recall fast" in state(later)["text"]
