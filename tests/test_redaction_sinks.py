"""Agent text stored outside the journal is redacted too: run errors, titles, commands, jobs, stderr logs."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runs import discovery, turns
from runs.journal import NewEvent, done_event
from runs.models import AgentJob, AgentJobState, JournalEvent, RunStatus
from runs.redaction import REDACTED
from runs.runner.redact_stream import MAX_LOG_LINE, RedactedLog
from runs.runner.session_rows import store_between_turns, store_session_meta
from runs.runner.writer import JournalWriter
from tests import factories
from tests.support.procs import REPO

KEY = "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWX123"
HIDDEN = "ABCDEFGHIJKLMNOP"

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_run_interrupted_with_a_secret_in_its_reason_stores_the_error_redacted() -> None:
    run = factories.RunFactory(status="running")
    assert turns.do_mark_interrupted(run, f"agent crashed: OPENAI_API_KEY={KEY} rejected")
    run.refresh_from_db()
    assert run.status == RunStatus.INTERRUPTED
    assert HIDDEN not in run.error and REDACTED in run.error
    stored = [e.payload for e in JournalEvent.objects.filter(run=run)]
    assert HIDDEN not in str(stored)


def test_a_run_the_runner_fails_with_agent_text_stores_the_error_redacted() -> None:
    run = factories.RunFactory(status="running")
    message = f"agent died: password=hunter2secret and {KEY}"

    async def scenario() -> None:
        writer = JournalWriter(run.pk, window_ms=0)
        await writer.finish(
            [
                NewEvent("error", {"code": "agent_died", "message": message, "terminal": True}),
                done_event(RunStatus.FAILED, reason=message, code="agent_died"),
            ],
            error=message,
        )

    asyncio.run(scenario())
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "hunter2secret" not in run.error and HIDDEN not in run.error
    assert run.error.startswith("agent died: password=")


def test_an_agent_title_and_commands_carrying_secrets_are_stored_redacted() -> None:
    session = factories.SessionFactory(title="", agent_session_id="agent-s1")
    commands = [{"name": "deploy", "description": f"pushes with token={KEY}", "input_hint": f"Bearer {KEY}"}]
    store_session_meta(session.pk, f"Rotate {KEY}", commands)
    session.refresh_from_db()
    assert session.title == f"Rotate {REDACTED}"
    assert HIDDEN not in str(session.commands) and session.commands[0]["name"] == "deploy"
    # Sent after the turn ended: the same rule.
    other = factories.SessionFactory(title="", agent_session_id="agent-s2")
    store_between_turns("agent-s2", "Uses AKIAIOSFODNN7EXAMPLE", None)
    other.refresh_from_db()
    assert other.title == f"Uses {REDACTED}"


def test_a_job_error_and_result_carrying_secrets_are_stored_redacted() -> None:
    project = factories.ProjectFactory()
    failed = discovery.request_discovery(project)
    done = discovery.request_discovery(project)
    AgentJob.objects.filter(pk__in=[failed.pk, done.pk]).update(state=AgentJobState.RUNNING)
    discovery.finish_job(failed.pk, error_code="agent_died", error=f"agent printed {KEY}")
    result = {"sessions": [{"agent_session_id": "a1", "title": f"key {KEY}", "cwd": project.path}]}
    discovery.finish_job(done.pk, result=result)
    failed.refresh_from_db()
    done.refresh_from_db()
    assert failed.error == f"agent printed {REDACTED}"
    assert done.result["sessions"][0] == {
        "agent_session_id": "a1",
        "title": f"key {REDACTED}",
        "cwd": project.path,
    }


def test_an_imported_session_stores_its_title_and_commands_redacted() -> None:
    project = factories.ProjectFactory()
    history = discovery.ImportedHistory(
        turns=[], title=f"Setup {KEY}", commands=[{"name": "x", "description": "password=hunter2secret"}]
    )
    session, created = discovery.write_import(project.pk, "imported-1", history, "demo")
    session.refresh_from_db()
    assert created and session.title == f"Setup {REDACTED}"
    assert "hunter2secret" not in str(session.commands)


def test_an_agent_stderr_log_is_written_redacted_a_line_at_a_time(tmp_path: Path) -> None:
    log_path = tmp_path / "agent.log"
    log = RedactedLog(log_path)
    script = (
        "import sys\n"
        f"print('starting with key {KEY}', file=sys.stderr, flush=True)\n"
        "print('a' * 40000 + ' password=hunter2secret', file=sys.stderr, flush=True)\n"
        "sys.stderr.write('AKIAIOSFODNN7EXAMPLE at the end, no newline')\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stderr=log.fd)
    log.close_writer()
    assert child.wait(30) == 0
    log.wait(30)
    text = log_path.read_text()
    lines = text.splitlines()
    assert lines[0] == f"starting with key {REDACTED}"
    # A line longer than the bound is cut, so its tail (and the secret there) never lands.
    assert len(lines[1]) < MAX_LOG_LINE + 100 and "bytes cut]" in lines[1]
    assert "hunter2secret" not in text and HIDDEN not in text and "IOSFODNN7EXAMPLE" not in text
    assert lines[2] == f"{REDACTED} at the end, no newline"


def test_the_web_and_runner_log_lines_are_written_redacted(tmp_path: Path) -> None:
    # The process's own logging, configured by settings.LOGGING as daphne and the runner are.
    script = (
        "import logging\n"
        "log = logging.getLogger('runs.runner.forking')\n"
        f"log.warning('run 7: session/fork refused: %s', 'bad key {KEY}')\n"
        "try:\n"
        "    raise ValueError('AKIAIOSFODNN7EXAMPLE in the exception')\n"
        "except ValueError:\n"
        "    log.exception('a turn failed')\n"
    )
    env = {**os.environ, "HERMESWEB_DATA_DIR": str(tmp_path), "REDIS_URL": "", "DATABASE_URL": ""}
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert f"session/fork refused: bad key {REDACTED}" in done.stderr
    assert "ValueError: " + REDACTED + " in the exception" in done.stderr
    assert HIDDEN not in done.stderr and "IOSFODNN7EXAMPLE" not in done.stderr
