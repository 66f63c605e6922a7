"""The agent sandbox with real Hermes: a scripted `terminal` tool call probes what it can reach.

Issue 22 items 1 and 2; docs/security.md. The scripted model asks Hermes to run the probe of
tests/test_sandbox.py with its `terminal` tool; what the command printed comes back to the
model as the tool's result, where the test reads it. Hermes runs with the user's own
HERMES_HOME (the state directory), reading the operator's config.yaml bound in read-only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from runs.agents import agent_state_dir
from runs.models import RunStatus
from tests import factories
from tests.support.hermes import AgentConfig
from tests.support.procs import Proc, start_runner
from tests.support.runs import assert_journal_well_formed, run_of, submit, wait_status
from tests.support.scripted_llm import ScriptedLLM, text, tool_call
from tests.test_sandbox import (  # noqa: F401 - fixtures are used by name
    Probe,
    canary,
    needs_bwrap,
    outside_dir,
    secrets_of_the_service,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.hermes, needs_bwrap]


def tool_results(body: dict[str, Any]) -> str:
    """The tool messages of a request to the model: what Hermes' tools returned (JSON text)."""
    contents = [str(m.get("content")) for m in body.get("messages") or [] if m.get("role") == "tool"]
    return "\n".join(contents).replace("\\n", "\n")


@pytest.mark.timeout(180)  # Hermes starts in ~1.5 s; a busy 2-core box doubles everything
def test_hermes_reads_nothing_of_the_service_or_other_projects_and_edits_its_own(
    runners: list[Proc],
    logs: Path,
    settings: Any,
    user: Any,
    other_user: Any,
    hermes_agent_config: AgentConfig,
    scripted_llm: ScriptedLLM,
    canary: Path,
    outside_dir: Path,
) -> None:
    from runs.agents import _spec

    spec = {**hermes_agent_config, "cumulative_usage": True, "steer": "slash"}
    settings.HERMESWEB_AGENTS = {**settings.HERMESWEB_AGENTS, "hermes": _spec("hermes", spec, "test")}
    runner = start_runner(logs, "sandbox-hermes", HERMESWEB_AGENTS=json.dumps({"hermes": spec}))
    runners.append(runner)
    mine = factories.ProjectFactory(owner=user, agent="hermes")
    theirs = factories.ProjectFactory(owner=other_user, agent="hermes")
    (Path(theirs.path) / "theirs.txt").write_text("private\n")
    secrets = secrets_of_the_service(canary)
    probe = Probe.build(
        secrets=secrets,
        other_project=Path(theirs.path),
        runner_pid=runner.pid,
        outside=outside_dir,
        unmount=Path(settings.DATA_DIR),
    )
    scripted_llm.enqueue(tool_call("terminal", {"command": probe.script}), text("Probed."))

    session = factories.SessionFactory(project=mine)
    run = run_of(submit(session, "Run the probe"))
    wait_status(run, RunStatus.COMPLETED, timeout=120, log=runner.log)
    assert_journal_well_formed(run)
    seen = Probe.results(tool_results(scripted_llm.scripted_requests[-1]))
    print(f"probe (hermes): {seen}")

    assert {name: seen.get(name) for name in secrets} == dict.fromkeys(secrets, "hidden"), seen
    assert (seen["other"], seen["environ"], seen["envleak"]) == ("hidden", "hidden", "0"), seen
    assert seen["unmounted"] == "hidden", seen
    assert seen["uid"] != "0" and seen["shadow"] == "hidden", seen  # never root
    assert seen["outside"] == "refused" and not (outside_dir / "probe").exists()
    assert seen["project"] == "written"
    assert (Path(mine.path) / "written-by-agent.txt").read_text() == "ok\n"

    # Per-user state: HOME and HERMES_HOME are the user's own; the operator's home only lends
    # its config.yaml (read-only), and gets none of the user's sessions.
    state_dir = agent_state_dir(settings.DATA_DIR, user.pk, "hermes")
    assert seen["home"] == seen["hermes_home"] == str(state_dir)
    operator_home = Path(hermes_agent_config["env"]["HERMES_HOME"])
    assert sorted(p.name for p in operator_home.iterdir()) == ["config.yaml"]
    written = {p.name for p in state_dir.iterdir()}
    assert "config.yaml" in written and len(written) > 1, written
    assert "UNSANDBOXED" not in runner.log()
