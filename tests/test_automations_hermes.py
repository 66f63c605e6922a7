"""A scheduled firing with the real Hermes Agent (issue 42): the runner's scheduler fires a
one-shot, and Hermes (against the test's scripted model server) completes the run it launched."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from automations import services
from automations.models import Firing, FiringOutcome
from runs.models import Run, RunStatus
from tests import factories
from tests.support.hermes import AgentConfig
from tests.support.procs import Proc, start_runner, wait_for
from tests.support.runs import assert_journal_well_formed, state, wait_status
from tests.support.scripted_llm import ScriptedLLM, text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.hermes]


def test_a_scheduled_firings_run_completes_with_hermes(
    runners: list[Proc],
    logs: Path,
    settings: Any,
    hermes_agent_config: AgentConfig,
    scripted_llm: ScriptedLLM,
) -> None:
    from runs.agents import load_agents

    environ = {"HERMESWEB_AGENTS": json.dumps({"hermes": hermes_agent_config})}
    settings.HERMESWEB_AGENTS = {**settings.HERMESWEB_AGENTS, **load_agents(settings.DATA_DIR, environ)}
    project = factories.ProjectFactory(agent="hermes")
    workflow = factories.WorkflowFactory(project=project, prompt_template="Summarise {what}.")
    scripted_llm.enqueue(text("Yesterday: three commits, all green.", chunks=3))
    at = timezone.now() + timedelta(seconds=2)
    trigger = services.do_create_trigger(
        workflow, kind="schedule", at=at, variables={"what": "yesterday's commits"}
    ).trigger
    runner = start_runner(logs, "hermes-scheduler", **environ)
    runners.append(runner)

    firing = wait_for(lambda: Firing.objects.filter(trigger=trigger).first(), 60, what="the firing")
    assert firing.outcome == FiringOutcome.LAUNCHED, firing.reason
    run = Run.objects.get(pk=firing.run_id)
    wait_status(run, RunStatus.COMPLETED, timeout=120, log=runner.log)
    assert_journal_well_formed(run)
    assert run.prompt_text == "Summarise yesterday's commits."
    assert "three commits, all green" in state(run)["text"]
