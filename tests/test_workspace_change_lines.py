"""The lines a changes view's fold opens: a file's lines on the changes' newer side, bounded.

`GET /api/runs/{id}/changes/lines` reads the run's end checkpoint (the tree now while it has
none); the session's route its last checkpoint. Checkpoints taken with the real store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from runs.models import RunStatus
from tests import factories
from workspace.services import record_checkpoint, store_of

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def run(user: Any) -> Any:
    """A finished turn that changed line 50 of a 100-line file; the file rewritten on disk since."""
    project = factories.ProjectFactory(owner=user)
    root = Path(project.path)
    (root / "long.txt").write_text("".join(f"line {n}\n" for n in range(1, 101)))
    session = factories.SessionFactory(project=project)
    run = factories.RunFactory(session=session, status=RunStatus.COMPLETED)
    store = store_of(project)
    ids = dict(run_id=run.pk, session_id=session.pk, project_id=project.pk)
    record_checkpoint(**ids, kind="start", snapshot=store.snapshot())
    (root / "long.txt").write_text("".join(f"line {'fifty' if n == 50 else n}\n" for n in range(1, 101)))
    record_checkpoint(**ids, kind="end", snapshot=store.snapshot())
    (root / "long.txt").write_text("rewritten since\n")
    return run


def test_a_runs_lines_come_from_its_end_checkpoint(api: Client, run: Any) -> None:
    answer = api.get(f"/api/runs/{run.pk}/changes/lines", {"path": "long.txt", "start": 48, "count": 5})
    assert answer.status_code == 200, answer.content
    assert answer.json() == {
        "path": "long.txt",
        "start": 48,
        "lines": ["line 48", "line 49", "line fifty", "line 51", "line 52"],
        "total": 100,
    }


def test_a_sessions_lines_come_from_its_last_checkpoint(api: Client, run: Any) -> None:
    answer = api.get(f"/api/sessions/{run.session_id}/changes/lines", {"path": "long.txt", "start": 99})
    assert answer.json()["lines"] == ["line 99", "line 100"]


def test_bounds_escapes_and_someone_elses_run_are_refused(api: Client, run: Any, other_user: Any) -> None:
    url = f"/api/runs/{run.pk}/changes/lines"
    assert api.get(url, {"path": "long.txt", "count": 2001}).status_code == 422
    assert api.get(url, {"path": "long.txt", "start": 0}).status_code == 422
    for path in ("../long.txt", "/etc/passwd", "missing.txt", ""):
        assert api.get(url, {"path": path}).status_code == 404, path
    stranger = Client()
    stranger.force_login(other_user)
    assert stranger.get(url, {"path": "long.txt"}).status_code == 404
