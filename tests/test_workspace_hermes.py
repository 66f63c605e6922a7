"""The workspace with the real Hermes Agent, offline (docs/workspace.md; tests/support/hermes.py).

An edit through Hermes' `write_file` tool and a change made by its `terminal` tool both show in
their runs' changes; rewinding the first turn restores exact bytes (a deleted binary file, an
executable bit), journaled in the session; the undo puts them back; and the next prompt tells
Hermes which files were restored.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from runs.controls import do_respond_approval
from runs.journal.payloads import payload_errors
from runs.models import JournalEvent, Run, RunSource, RunStatus
from tests import factories
from tests.support.hermes import AgentConfig
from tests.support.procs import Proc, start_runner, wait_for
from tests.support.runs import run_of, submit
from tests.support.scripted_llm import ScriptedLLM, request_text, text, tool_call
from tests.support.workspace import by_path, changes

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.hermes]

BLOB = bytes(range(256)) * 2 + b"\x00tail"


@pytest.fixture
def runner(runners: list[Proc], logs: Path, hermes_agent_config: AgentConfig) -> Proc:
    proc = start_runner(logs, "hermes-ws", HERMESWEB_AGENTS=json.dumps({"hermes": hermes_agent_config}))
    runners.append(proc)
    return proc


@pytest.fixture
def session(db: None, settings: Any, user: Any, hermes_agent_config: AgentConfig) -> Any:
    from runs.agents import load_agents

    configured = load_agents(
        settings.DATA_DIR, {"HERMESWEB_AGENTS": json.dumps({"hermes": hermes_agent_config})}
    )
    settings.HERMESWEB_AGENTS = {**settings.HERMESWEB_AGENTS, "hermes": configured["hermes"]}
    return factories.SessionFactory(project=factories.ProjectFactory(owner=user, agent="hermes"))


def finish(run: Run, runner: Proc) -> Run:
    """Wait for the turn to end; each permission Hermes asks for is answered by the user here."""
    answered: set[str] = set()

    def asked() -> list[str]:
        found = JournalEvent.objects.filter(run=run, type="approval.requested").values_list(
            "payload", flat=True
        )
        return [p["approval_id"] for p in found if p["approval_id"] not in answered]

    def moved() -> bool:
        run.refresh_from_db()
        return run.is_terminal or bool(asked())

    while True:
        wait_for(moved, 90, what=f"run {run.pk} to end or ask")
        for approval_id in asked():
            answered.add(approval_id)
            assert do_respond_approval(run, approval_id, "allow_once").status == "accepted"
        if run.is_terminal and not asked():
            if run.status != RunStatus.COMPLETED:
                print(runner.log())
            assert run.status == RunStatus.COMPLETED, (run.status, run.error)
            return run


def files(project: Path) -> dict[str, tuple[bytes, bool]]:
    return {
        str(p.relative_to(project)): (p.read_bytes(), os.access(p, os.X_OK))
        for p in sorted(project.rglob("*"))
        if p.is_file() and ".git" not in p.parts
    }


def post(api: Client, url: str) -> dict[str, Any]:
    response = api.post(url, {"client_id": uuid.uuid4().hex}, content_type="application/json")
    assert response.status_code == 200, response.content
    return response.json()


def test_hermes_tool_and_shell_changes_show_and_rewind_restores_exact_bytes_and_undo_puts_them_back(
    api: Client, runner: Proc, session: Any, scripted_llm: ScriptedLLM
) -> None:
    project = Path(session.project.path)
    (project / "a.txt").write_text("zero\n")
    (project / "gone.bin").write_bytes(BLOB)
    (project / "tool.sh").write_text("#!/bin/sh\necho hi\n")
    (project / "tool.sh").chmod(0o755)
    before = files(project)

    # An edit through Hermes' file tool.
    scripted_llm.enqueue(
        tool_call("write_file", {"path": str(project / "notes.txt"), "content": "from the tool\n"}),
        text("Wrote the notes."),
    )
    first = finish(run_of(submit(session, "Write the notes")), runner)
    assert (project / "notes.txt").read_text() == "from the tool\n"
    body = changes(api, f"/api/runs/{first.pk}/changes")
    assert body["complete"] and by_path(body)["notes.txt"]["status"] == "added"
    assert by_path(body)["notes.txt"]["additions"] == 1

    # A change made by a shell command through its terminal tool.
    command = f"cd {project} && printf 'one\\n' > a.txt && rm gone.bin && chmod -x tool.sh"
    scripted_llm.enqueue(tool_call("terminal", {"command": command}), text("Changed them."))
    second = finish(run_of(submit(session, "Change the files")), runner)
    after_two = files(project)
    assert after_two != before
    body = by_path(changes(api, f"/api/runs/{second.pk}/changes"))
    assert (body["a.txt"]["status"], body["gone.bin"]["status"]) == ("modified", "deleted")
    assert body["gone.bin"]["binary"] and "tool.sh" in body
    assert "notes.txt" not in body  # the first turn's, not this one's

    # Rewind the first turn: exact bytes, the binary file back, the executable bit back.
    rewound = post(api, f"/api/runs/{first.pk}/rewind")
    assert sorted(rewound["restored"]) == ["a.txt", "gone.bin", "notes.txt", "tool.sh"]
    assert files(project) == before
    record = Run.objects.get(session=session, source=RunSource.WORKSPACE)
    journal = list(JournalEvent.objects.filter(run=record).order_by("seq"))
    assert [e.type for e in journal] == ["run.started", "files.restored", "done"]
    assert payload_errors("files.restored", journal[1].payload) == []
    assert (journal[1].payload["turn"], journal[1].payload["undo"]) == (1, rewound["undo"])

    # Undo: the state the rewind replaced, byte for byte.
    post(api, f"/api/checkpoints/{rewound['undo']}/restore")
    assert files(project) == after_two
    assert Run.objects.filter(session=session, source=RunSource.WORKSPACE).count() == 2

    # The next prompt tells Hermes which files were restored, before the user's text.
    scripted_llm.enqueue(text("Noted."))
    finish(run_of(submit(session, "What changed?")), runner)
    sent = request_text(scripted_llm.scripted_requests[-1])
    assert "the user restored files in the project" in sent
    assert sent.index("restored files") < sent.index("What changed?")
    assert "gone.bin" in sent
