"""Helpers for the workspace tests: a runner whose demo agent runs shell commands, and turns."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

from django.conf import settings
from django.test import Client

from projects.models import Session
from runs import agents
from runs.models import Run, RunStatus
from tests.support.procs import Proc, start_runner
from tests.support.runs import run_of, submit, wait_status

# The runner is root here: it starts agents only sandboxed (as the agent account), so bwrap must work.
SANDBOX = "auto" if agents.bwrap().path else "none"


def shell_runner(runners: list[Proc], logs: Path, name: str = "ws", **env: str) -> Proc:
    """A runner whose demo agent takes the test-only `shell <command>` (tests/test_sandbox.py)."""
    spec = dataclasses.asdict(settings.HERMESWEB_AGENTS["demo"])
    spec.pop("name")
    spec["env"] = {**spec["env"], "HERMESWEB_DEMO_DELAY": "0.002", "HERMESWEB_DEMO_SHELL": "1"}
    spec["sandbox"] = SANDBOX
    proc = start_runner(logs, name, HERMESWEB_AGENTS=json.dumps({"demo": spec}), **env)
    runners.append(proc)
    return proc


def turn(session: Session, text: str, runner: Proc, status: str = RunStatus.COMPLETED) -> Run:
    """Send `text` as a new turn and wait for it to end with `status`."""
    run = run_of(submit(session, text))
    wait_status(run, status, RunStatus.FAILED, RunStatus.COMPLETED, timeout=60, log=runner.log)
    run.refresh_from_db()
    assert run.status == status, (run.status, run.error)
    return run


def shell(session: Session, command: str, runner: Proc) -> Run:
    run = turn(session, f"shell {command}", runner)
    return run


def changes(api: Client, url: str) -> dict[str, Any]:
    response = api.get(url)
    assert response.status_code == 200, response.content
    return response.json()


def by_path(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["path"]: f for f in body["files"]}


def rewind(api: Client, run_id: int, force: bool = False, client_id: str | None = None) -> Any:
    body = {"client_id": client_id or uuid.uuid4().hex, "force": force}
    return api.post(f"/api/runs/{run_id}/rewind", body, content_type="application/json")


def restore(api: Client, checkpoint_id: int, force: bool = False) -> Any:
    body = {"client_id": uuid.uuid4().hex, "force": force}
    return api.post(f"/api/checkpoints/{checkpoint_id}/restore", body, content_type="application/json")
