"""Usage: `usage_update` journaled, a session's total in GET /api/sessions/{id}, a user's in the admin.

The runner tests drive a real `manage.py runner` on the bundled demo agent, which sends a
`usage_update` (context used and size, a cumulative cost in USD) after each turn and reports the
turn's token usage in its prompt response.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from runs.models import Run, RunStatus
from runs.usage import session_usage, total_of, user_usage
from tests import factories
from tests.support.procs import Proc, start_runner
from tests.support.runs import events, run_of, state, submit, wait_status


def test_a_total_sums_token_counts_and_keeps_the_last_context_and_cost() -> None:
    first = {"inputTokens": 10, "outputTokens": 5, "context": {"used": 100, "size": 1000}}
    second = {
        "inputTokens": 7,
        "outputTokens": 3,
        "thoughtTokens": 2,
        "cached": True,  # not a count
        "session_total": {"inputTokens": 17},  # an agent's running total: not added again
        "context": {"used": 150, "size": 1000, "cost": {"amount": 0.25, "currency": "USD"}},
    }
    total = total_of([first, {}, second])
    assert total.tokens == {"inputTokens": 17, "outputTokens": 8, "thoughtTokens": 2}
    assert total.runs == 2
    assert total.context["used"] == 150
    assert total.cost == {"amount": 0.25, "currency": "USD"}


@pytest.fixture
def runner(runners: list[Proc], logs: Path) -> Proc:
    proc = start_runner(logs, "r1", HERMESWEB_DEMO_DELAY="0.005")
    runners.append(proc)
    return proc


def turn(session: Any, text: str, runner: Proc) -> Run:
    return wait_status(run_of(submit(session, text)), RunStatus.COMPLETED, log=runner.log)


@pytest.mark.django_db(transaction=True)
def test_usage_updates_are_journaled_and_folded_into_the_turns_state(runner: Proc, user: Any) -> None:
    session = factories.SessionFactory(project__agent="demo", project__owner=user)
    run = turn(session, "fast hello there", runner)
    updates = [e.payload for e in events(run) if e.type == "usage.updated"]
    assert updates, "the demo agent sends usage_update after each turn"
    last = updates[-1]
    assert last["size"] == 131_072 and 0 < last["used"] <= last["size"]
    assert last["cost"]["currency"] == "USD"
    assert state(run)["usage"]["size"] == 131_072  # the fold the meter reads (runs/transcript.py)


@pytest.mark.django_db(transaction=True)
def test_a_sessions_usage_total_is_in_its_api_answer(runner: Proc, user: Any, api: Client) -> None:
    session = factories.SessionFactory(project__agent="demo", project__owner=user)
    first = turn(session, "fast hello there", runner)
    second = turn(session, "fast and again with more words", runner)
    body = api.get(f"/api/sessions/{session.pk}").json()
    usage = body["usage"]
    assert usage["runs"] == 2
    expected = first.usage["outputTokens"] + Run.objects.get(pk=second.pk).usage["outputTokens"]
    assert usage["tokens"]["outputTokens"] == expected > 0
    assert usage["context"]["size"] == 131_072
    # The agent's cost is cumulative for the session: the last one is the session's.
    last_cost = [e.payload for e in events(second) if e.type == "usage.updated"][-1]["cost"]
    assert usage["cost"] == {"amount": last_cost["amount"], "currency": "USD"}
    assert usage["cost"]["amount"] > 0
    # Lists stay cheap: the total is in the single-session answer only.
    listed = api.get(f"/api/projects/{session.project_id}/sessions").json()
    assert listed[0]["usage"] is None
    assert session_usage(session.pk).tokens == usage["tokens"]


@pytest.mark.django_db(transaction=True)
def test_the_admin_shows_each_users_usage_over_all_sessions(
    runner: Proc, user: Any, admin_client: Client
) -> None:
    for words in ("fast one", "fast two words"):
        turn(factories.SessionFactory(project__agent="demo", project__owner=user), words, runner)
    totals = user_usage(user.pk)
    assert totals.runs == 2 and totals.costs["USD"] > 0
    page = admin_client.get("/admin/auth/user/").content.decode()
    assert "Usage (all sessions)" in page
    assert f"{totals.tokens['totalTokens']:,} tokens" in page
    assert "2 turns" in page
