"""A rewind journaled in a session (a `workspace` run) stays what it is when forked and exported.

The fork copies it as a workspace run (no prompt, not a turn: the transcript shows no user
bubble above "Files restored"); the exports give it no prompt, the Markdown one a line saying
what was restored. A fork also carries the parent's config choices (projects/session_options.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from projects.models import Session
from projects.session_options import normalize
from runs.models import Run, RunSource, RunStatus
from tests import factories

FORKABLE = {"demo": {"session_capabilities": {"fork": {}, "list": {}}}}
# As the agent reports them (ACP `configOptions`), stored in the shape the API serves.
OPTIONS = normalize(
    [
        {
            "id": "effort",
            "name": "Reasoning effort",
            "type": "select",
            "currentValue": "high",
            "options": [{"value": "low", "name": "Low"}, {"value": "high", "name": "High"}],
        }
    ]
)


@pytest.fixture
def parent(session: Any) -> Any:
    """Two turns, then a rewind to before the second (as workspace.services journals it)."""
    Session.objects.filter(pk=session.pk).update(
        agent_session_id="agent-parent-1", title="Rewound", config_options=OPTIONS, config={"effort": "low"}
    )
    session.refresh_from_db()
    for prompt in ("Write a.txt", "Write b.txt"):
        factories.run_with_events(
            [
                ("run.started", {"status": "running", "session_id": session.pk}),
                ("token.delta", {"message_id": "m0", "delta": f"Done: {prompt}."}),
                ("done", {"state": "completed", "stop_reason": "end_turn"}),
            ],
            session=session,
            prompt_text=prompt,
            status=RunStatus.RUNNING,
        )
    second = Run.objects.filter(session=session).order_by("-id").first()
    assert second is not None
    factories.run_with_events(
        [
            ("run.started", {"status": "running", "session_id": session.pk, "source": "workspace"}),
            (
                "files.restored",
                {
                    "action": "rewind",
                    "paths": ["b.txt", "c.txt"],
                    "count": 2,
                    "undo": 41,
                    "undid": False,
                    "forced": False,
                    "run_id": second.pk,
                    "turn": 2,
                },
            ),
            ("done", {"state": "completed"}),
        ],
        session=session,
        prompt_text="",
        source=RunSource.WORKSPACE,
        source_meta={"checkpoint": 41},
        status=RunStatus.RUNNING,
    )
    factories.RunnerFactory(agent_capabilities=FORKABLE)
    return session


def fork_of(api: Client, parent: Any) -> Session:
    response = api.post(f"/api/sessions/{parent.pk}/fork")
    assert response.status_code == 201, response.content
    return Session.objects.get(pk=response.json()["id"])


@pytest.mark.django_db
def test_a_forked_rewind_is_a_workspace_run_not_an_empty_turn(api: Client, parent: Any) -> None:
    fork = fork_of(api, parent)
    copies = list(Run.objects.filter(session=fork).order_by("created_at", "id"))
    assert [c.source for c in copies] == [RunSource.IMPORT, RunSource.IMPORT, RunSource.WORKSPACE]
    rewind = copies[-1]
    original = Run.objects.get(session=parent, source=RunSource.WORKSPACE)
    assert rewind.source_meta == {
        "checkpoint": 41,
        "forked_from_run": original.pk,
        "forked_from_session": parent.pk,
    }
    turns = api.get(f"/api/sessions/{fork.pk}/transcript").json()["turns"]
    assert turns[-1]["source"] == "workspace"
    assert [i["kind"] for i in turns[-1]["state"]["items"]] == ["files_restored"]


@pytest.mark.django_db
def test_a_fork_carries_the_parents_config_choices(api: Client, parent: Any) -> None:
    fork = fork_of(api, parent)
    assert fork.config == {"effort": "low"}
    assert fork.config_options == OPTIONS


@pytest.mark.django_db
def test_exports_show_a_rewind_as_a_line_without_a_prompt(api: Client, parent: Any) -> None:
    fork = fork_of(api, parent)
    for session in (parent, fork):
        markdown = b"".join(
            api.get(f"/api/sessions/{session.pk}/export?format=markdown").streaming_content
        ).decode()
        assert markdown.count("## You") == 2
        tail = markdown.rsplit("---", 1)[1]
        assert tail.strip() == "*Files restored to before turn 2 — 2 files*"
        exported = b"".join(api.get(f"/api/sessions/{session.pk}/export?format=json").streaming_content)
        turns = json.loads(exported)["turns"]
        assert [t["prompt"] is None for t in turns] == [False, False, True]
        assert turns[-1]["source"] == "workspace"
