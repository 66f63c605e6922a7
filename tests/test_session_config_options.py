"""A session's config options (ACP `configOptions`): shown, chosen over the API, applied by the runner.

The API tests use the database only; the runner tests drive real `manage.py runner` processes
on the bundled demo agent, which reports three options — `effort` (a flat select), `voice` (a
grouped select) and `verbose` (a boolean) — refuses values it lacks, answers `/status` with its
current values, and switches its own effort on `/effort <value>` (a `config_option_update`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from projects.models import Session
from projects.services import do_update_session
from projects.session_options import clean_config, normalize, pending
from runs.models import RunStatus
from tests import factories
from tests.support.procs import Proc, start_runner
from tests.support.runs import events, run_of, state, submit, types, wait_status

JSON = "application/json"
# As an agent reports them: a flat select, a grouped select, a boolean.
REPORTED = [
    {
        "id": "effort",
        "name": "Effort",
        "category": "thought_level",
        "type": "select",
        "currentValue": "medium",
        "options": [{"value": "low", "name": "Low"}, {"value": "medium", "name": "Medium"}],
    },
    {
        "id": "voice",
        "name": "Voice",
        "type": "select",
        "currentValue": "plain",
        "options": [
            {"group": "plain", "name": "Plain", "options": [{"value": "plain", "name": "Plain"}]},
            {"group": "playful", "name": "Playful", "options": [{"value": "pirate", "name": "Pirate"}]},
        ],
    },
    {"id": "verbose", "name": "Verbose", "type": "boolean", "currentValue": False},
    {"id": "broken", "type": "slider"},  # a shape the client does not know: dropped
]


def patch(api: Client, session: Any, config: Any) -> Any:
    return api.patch(f"/api/sessions/{session.pk}", {"config": config}, content_type=JSON)


# ---------------------------------------------------------------- shapes


def test_reported_options_are_normalized_with_groups_flattened_and_unknown_shapes_dropped() -> None:
    options = normalize(REPORTED)
    assert [o["id"] for o in options] == ["effort", "voice", "verbose"]
    assert options[0]["category"] == "thought_level" and options[0]["current"] == "medium"
    assert [(v["value"], v["group"]) for v in options[1]["values"]] == [
        ("plain", "Plain"),
        ("pirate", "Playful"),
    ]
    assert options[2] == {
        "id": "verbose",
        "name": "Verbose",
        "description": "",
        "category": "",
        "type": "boolean",
        "current": False,
        "values": [],
    }


def test_only_choices_differing_from_the_agents_current_values_are_pending() -> None:
    options = normalize(REPORTED)
    chosen = {"effort": "medium", "voice": "pirate", "verbose": True, "gone": "x"}
    assert [(o["id"], v) for o, v in pending(options, chosen)] == [("voice", "pirate"), ("verbose", True)]
    assert clean_config({"voice": ""}, options, {"voice": "pirate"}) == {}  # "" clears a choice


# ---------------------------------------------------------------- API


@pytest.mark.django_db
def test_a_session_shows_its_config_options_and_choices(api: Client, session: Any) -> None:
    assert api.get(f"/api/sessions/{session.pk}").json()["config_options"] == []
    Session.objects.filter(pk=session.pk).update(config_options=normalize(REPORTED))
    body = api.get(f"/api/sessions/{session.pk}").json()
    assert [o["id"] for o in body["config_options"]] == ["effort", "voice", "verbose"]
    assert body["config_options"][1]["values"][1] == {
        "value": "pirate",
        "name": "Pirate",
        "description": "",
        "group": "Playful",
    }
    assert body["config"] == {}


@pytest.mark.django_db
def test_patching_config_chooses_values_merged_with_earlier_choices(api: Client, session: Any) -> None:
    Session.objects.filter(pk=session.pk).update(config_options=normalize(REPORTED))
    first = patch(api, session, {"voice": "pirate"})
    assert first.status_code == 200, first.content
    second = patch(api, session, {"verbose": True})
    assert second.json()["config"] == {"voice": "pirate", "verbose": True}
    session.refresh_from_db()
    assert session.config == {"voice": "pirate", "verbose": True}
    assert patch(api, session, {"voice": None}).json()["config"] == {"verbose": True}


@pytest.mark.django_db
def test_an_option_the_agent_did_not_report_is_refused_with_unknown_config_option(
    api: Client, session: Any
) -> None:
    refused = patch(api, session, {"effort": "low"})  # nothing reported yet
    assert refused.status_code == 422
    assert refused.json()["code"] == "unknown_config_option"
    Session.objects.filter(pk=session.pk).update(config_options=normalize(REPORTED))
    assert patch(api, session, {"temperature": "hot"}).json()["code"] == "unknown_config_option"
    session.refresh_from_db()
    assert session.config == {}


@pytest.mark.django_db
@pytest.mark.parametrize(
    "config",
    [{"effort": "extreme"}, {"verbose": "yes"}, {"effort": True}, {"voice": "Playful"}],
    ids=["unknown-value", "string-for-boolean", "boolean-for-select", "a-group-is-no-value"],
)
def test_a_value_the_option_does_not_offer_is_refused_with_invalid_config_value(
    api: Client, session: Any, config: dict[str, Any]
) -> None:
    Session.objects.filter(pk=session.pk).update(
        config_options=normalize(REPORTED), config={"voice": "pirate"}
    )
    refused = patch(api, session, config)
    assert refused.status_code == 422
    assert refused.json()["code"] == "invalid_config_value"
    session.refresh_from_db()
    assert session.config == {"voice": "pirate"}  # nothing lost, nothing half-applied


# ---------------------------------------------------------------- runner, demo agent


@pytest.fixture
def runner(runners: list[Proc], logs: Path) -> Proc:
    proc = start_runner(logs, "r1", HERMESWEB_DEMO_DELAY="0.005")
    runners.append(proc)
    return proc


@pytest.fixture
def demo_session(db: None) -> Any:
    return factories.SessionFactory(project__agent="demo")


def turn(session: Any, text: str, runner: Proc, status: str = RunStatus.COMPLETED) -> Any:
    run = run_of(submit(session, text))
    return wait_status(run, status, log=runner.log)


def current(session: Any) -> dict[str, Any]:
    session.refresh_from_db()
    return {o["id"]: o["current"] for o in session.config_options}


@pytest.mark.django_db(transaction=True)
def test_the_runner_stores_the_config_options_the_demo_agent_reports(runner: Proc, demo_session: Any) -> None:
    turn(demo_session, "fast hello", runner)
    assert current(demo_session) == {"effort": "medium", "voice": "plain", "verbose": False}
    voice = next(o for o in demo_session.config_options if o["id"] == "voice")
    assert [(v["value"], v["group"]) for v in voice["values"]] == [
        ("plain", "Plain"),
        ("terse", "Plain"),
        ("pirate", "Playful"),
    ]


@pytest.mark.django_db(transaction=True)
def test_chosen_config_values_reach_the_agent_before_the_next_turn(runner: Proc, demo_session: Any) -> None:
    turn(demo_session, "fast hello", runner)
    demo_session.refresh_from_db()
    do_update_session(demo_session, config={"effort": "high", "voice": "pirate", "verbose": True})
    text = state(turn(demo_session, "/status", runner))["text"]
    assert "config: effort=high, voice=pirate, verbose=true" in text
    # The agent's answer to set_config_option (its current values) is what the session shows.
    assert current(demo_session) == {"effort": "high", "voice": "pirate", "verbose": True}
    # Idempotent: the agent has them; the next turn sends nothing and still has them.
    assert "effort=high, voice=pirate, verbose=true" in state(turn(demo_session, "/status", runner))["text"]


@pytest.mark.django_db(transaction=True)
def test_chosen_config_survives_a_fresh_agent_process(
    runners: list[Proc], logs: Path, demo_session: Any
) -> None:
    first = start_runner(logs, "r1", HERMESWEB_DEMO_DELAY="0.005")
    runners.append(first)
    turn(demo_session, "fast hello", first)
    demo_session.refresh_from_db()
    do_update_session(demo_session, config={"effort": "low"})
    first.stop()
    second = start_runner(logs, "r2", HERMESWEB_DEMO_DELAY="0.005")
    runners.append(second)
    assert "effort=low" in state(turn(demo_session, "/status", second))["text"]


@pytest.mark.django_db(transaction=True)
def test_a_value_the_agent_refuses_fails_the_turn_with_config_refused(
    runner: Proc, demo_session: Any
) -> None:
    turn(demo_session, "fast hello", runner)
    # The agent's list changed under the choice (stored as if it offered the value once).
    options = demo_session.__class__.objects.get(pk=demo_session.pk).config_options
    effort = next(o for o in options if o["id"] == "effort")
    effort["values"].append({"value": "refused-max", "name": "Max", "description": "", "group": ""})
    Session.objects.filter(pk=demo_session.pk).update(
        config_options=options, config={"effort": "refused-max"}
    )
    failed = turn(demo_session, "fast again", runner, RunStatus.FAILED)
    error = next(e.payload for e in events(failed) if e.type == "error")
    assert error["code"] == "config_refused"
    assert "refused-max" in error["message"]
    assert "token.delta" not in types(failed)  # the prompt was never sent


@pytest.mark.django_db(transaction=True)
def test_an_option_the_agent_changes_itself_reaches_the_session(runner: Proc, demo_session: Any) -> None:
    turn(demo_session, "fast hello", runner)
    turn(demo_session, "/effort high", runner)  # config_option_update from the agent mid-turn
    assert current(demo_session)["effort"] == "high"
