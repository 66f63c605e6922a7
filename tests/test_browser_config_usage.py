"""The agent's config option pickers and the context meter beside the composer, in a real browser.

The demo agent reports three config options — `Effort` (a select), `Voice` (a select in two
groups) and `Verbose` (a boolean) — answers `/status` with their values, and sends a
`usage_update` (context used of 131,072 tokens, a cost in USD) after each turn
(docs/demo-agent.md). Screenshots: light, dark and phone (420 px).
"""

from __future__ import annotations

from typing import Any

import pytest

from projects.models import Session
from tests import factories
from tests.support.browser import (  # noqa: F401 - fixtures
    Workbench,
    browser,
    open_session,
    screenshots,
    send,
    wait_settled,
    workbench,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

PHONE = {"width": 420, "height": 860}


@pytest.fixture
def session(user: Any) -> Any:
    project = factories.ProjectFactory(owner=user, name="Demo project", agent="demo")
    return factories.SessionFactory(project=project, title="Config and usage")


def wait_options(page: Any) -> None:
    """The config pickers drawn from the snapshot that followed the first turn."""
    page.wait_for_selector("[data-role=config-pickers]:not([hidden]) [data-config-id=voice]")


def test_config_pickers_choose_what_the_next_turn_runs_with(workbench: Workbench, session: Any) -> None:
    page = workbench.new_page()
    open_session(page, session.pk)
    assert page.locator("[data-role=config-pickers]").is_hidden()  # nothing reported yet
    assert page.locator("[data-role=usage-meter]").is_hidden()
    send(page, "fast hello")
    wait_settled(page, 1)
    wait_options(page)
    effort = page.get_by_label("Effort", exact=True)
    voice = page.get_by_label("Voice", exact=True)
    verbose = page.get_by_label("Verbose", exact=True)
    assert (effort.input_value(), voice.input_value(), verbose.is_checked()) == ("medium", "plain", False)
    # Grouped values are drawn in their groups.
    groups = page.locator("[data-config-id=voice] optgroup")
    assert [groups.nth(i).get_attribute("label") for i in range(groups.count())] == ["Plain", "Playful"]

    voice.select_option("pirate")
    page.wait_for_selector("[data-role=picker-status]:has-text('Voice: Pirate')")
    verbose.check()
    page.wait_for_selector("[data-role=picker-status]:has-text('Verbose: on')")
    effort.select_option("high")
    page.wait_for_selector("[data-role=picker-status]:has-text('Effort: High')")
    session.refresh_from_db()
    assert session.config == {"voice": "pirate", "verbose": True, "effort": "high"}

    send(page, "/status")
    assert "config: effort=high, voice=pirate, verbose=true" in wait_settled(page, 2).inner_text()

    # The context meter beside the composer: the last usage_update of the session's turns.
    meter = page.locator("[data-role=usage-meter]")
    meter.wait_for(state="visible")
    assert meter.get_attribute("aria-valuemax") == "131072"
    assert int(meter.get_attribute("aria-valuenow") or 0) > 0
    assert "USD" in meter.inner_text() and "Context" in meter.inner_text()
    workbench.screenshot(page, "config-usage-light")

    # A reload reads the choices back from the session.
    page.reload()
    page.wait_for_selector("#workbench[data-ready='true']")
    wait_options(page)
    assert page.get_by_label("Voice", exact=True).input_value() == "pirate"
    assert page.get_by_label("Verbose", exact=True).is_checked()


def test_a_refused_choice_is_said_and_the_picker_goes_back(workbench: Workbench, session: Any) -> None:
    page = workbench.new_page()
    open_session(page, session.pk)
    send(page, "fast hello")
    wait_settled(page, 1)
    wait_options(page)
    # The agent's list changed meanwhile (another tab, a new turn): the server refuses the value.
    options = Session.objects.get(pk=session.pk).config_options
    for option in options:
        if option["id"] == "voice":
            option["values"] = [v for v in option["values"] if v["value"] != "pirate"]
    Session.objects.filter(pk=session.pk).update(config_options=options)
    page.get_by_label("Voice", exact=True).select_option("pirate")
    page.wait_for_selector("[data-role=picker-status][data-failed=true]:has-text('Not changed')")
    assert page.get_by_label("Voice", exact=True).input_value() == "plain"
    assert Session.objects.get(pk=session.pk).config == {}


def test_dark_and_phone_show_the_pickers_and_the_meter(workbench: Workbench, session: Any) -> None:
    page = workbench.new_page(color_scheme="dark")
    open_session(page, session.pk)
    send(page, "fast hello")
    wait_settled(page, 1)
    wait_options(page)
    page.locator("[data-role=usage-meter]").wait_for(state="visible")
    workbench.screenshot(page, "config-usage-dark")

    phone = workbench.new_page(viewport=PHONE)
    open_session(phone, session.pk)
    wait_options(phone)
    meter = phone.locator("[data-role=usage-meter]")
    meter.wait_for(state="visible")
    # Everything beside the composer stays inside the phone's width, and nothing overlaps.
    boxes = phone.evaluate(
        "() => [...document.querySelectorAll('[data-role=pickers] .picker, [data-role=usage-meter]')]"
        ".map((el) => { const r = el.getBoundingClientRect();"
        " const control = el.querySelector('select, input[type=text]');"
        " return [r.left, r.top, r.right, r.bottom, control ? control.clientWidth : 99]; })"
    )
    assert max(b[2] for b in boxes) <= PHONE["width"]
    for i, a in enumerate(boxes):
        assert a[4] >= 40, f"a control squeezed to {a[4]} px"
        for b in boxes[i + 1 :]:
            apart = a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1]
            assert apart, f"{a} overlaps {b}"
    workbench.screenshot(phone, "config-usage-phone")


def test_the_project_dialog_picks_the_agent_from_the_operators_list(
    workbench: Workbench, session: Any
) -> None:
    page = workbench.new_page()
    open_session(page, session.pk)
    page.get_by_role("button", name="Edit project Demo project").click()
    dialog = page.get_by_role("dialog", name="Project “Demo project”")
    picker = dialog.get_by_label("Agent (configured by the operator)")
    dialog.locator("[data-role=agent-picker] option", has_text="Demo agent (demo)").wait_for(state="attached")
    assert picker.input_value() == "demo"
    names = dialog.locator("[data-role=agent-picker] option").evaluate_all("(els) => els.map((e) => e.value)")
    from django.conf import settings

    assert set(names) == set(settings.HERMESWEB_AGENTS)
    hint = dialog.locator("[data-role=agent-hint]")
    assert "Runs" in hint.inner_text() or "Cannot start" in hint.inner_text()
    workbench.screenshot(page, "agent-picker")
    dialog.get_by_role("button", name="Cancel").click()

    # A new project starts on the operator's default agent; one that cannot start is offered disabled.
    page.get_by_role("button", name="New project").click()
    created = page.get_by_role("dialog", name="New project")
    demo = created.locator("[data-role=agent-picker] option", has_text="Demo agent (demo)")
    demo.wait_for(state="attached")
    listed = {a["name"]: a for a in workbench_agents(workbench)}
    default = next(name for name, a in listed.items() if a["default"])
    if listed[default]["can_start"]:
        assert created.get_by_label("Agent (configured by the operator)").input_value() == default
    disabled = created.locator("[data-role=agent-picker] option").evaluate_all(
        "(els) => Object.fromEntries(els.map((e) => [e.value, e.disabled]))"
    )
    assert disabled == {name: not a["can_start"] for name, a in listed.items()}


def workbench_agents(workbench: Workbench) -> list[dict[str, Any]]:
    """GET /api/agents as the workbench's own server answers it (its settings, not this process's)."""
    page = workbench.new_page()
    return page.request.get(f"{workbench.base_url}/api/agents").json()


@pytest.mark.hermes
def test_with_real_hermes_the_meter_fills_and_no_config_pickers_are_drawn(
    workbench: Workbench, user: Any, settings: Any, hermes_agent_config: Any, scripted_llm: Any
) -> None:
    """Hermes 0.19 reports modes and models (their pickers) and no configOptions; its usage_update
    has the context but no cost (tests/test_hermes_config_usage.py)."""
    import json

    from runs.agents import load_agents
    from tests.support.procs import start_runner
    from tests.support.scripted_llm import text

    agents = json.dumps({"hermes": {**hermes_agent_config, "cumulative_usage": True, "steer": "slash"}})
    configured = load_agents(settings.DATA_DIR, {"HERMESWEB_AGENTS": agents})
    settings.HERMESWEB_AGENTS = {**settings.HERMESWEB_AGENTS, "hermes": configured["hermes"]}
    assert workbench.runner is not None
    workbench.runner.stop()
    workbench.settings_env["HERMESWEB_AGENTS"] = agents
    workbench.runner = start_runner(workbench.log_dir, runner_id="browser-hermes", **workbench.env())
    session = factories.SessionFactory(project__agent="hermes", project__owner=user, title="Hermes usage")

    page = workbench.new_page()
    open_session(page, session.pk)
    scripted_llm.enqueue(text("Hello from the scripted model."))
    send(page, "Say hello")
    wait_settled(page, 1)
    meter = page.locator("[data-role=usage-meter]")
    meter.wait_for(state="visible")
    assert int(meter.get_attribute("aria-valuemax") or 0) > 0
    assert int(meter.get_attribute("aria-valuenow") or 0) > 0
    assert "USD" not in meter.inner_text()  # no cost reported: none shown
    page.wait_for_function("() => document.querySelector('[data-role=mode-picker]').options.length === 3")
    assert page.locator("[data-role=config-pickers]").is_hidden()
    workbench.screenshot(page, "config-usage-hermes")


def test_config_options_of_category_mode_and_model_replace_those_pickers(
    workbench: Workbench, session: Any
) -> None:
    """As Codex and Claude report them (tests/fixtures/npm_agents/): a mode and a model among the
    config options; the older mode and model pickers give way to them."""
    reported = [
        {
            "id": "mode",
            "name": "Approval",
            "category": "mode",
            "type": "select",
            "currentValue": "ask",
            "options": [{"value": "ask", "name": "Ask"}, {"value": "auto", "name": "Auto"}],
        },
        {
            "id": "model",
            "name": "Engine",
            "category": "model",
            "type": "select",
            "currentValue": "m1",
            "options": [{"value": "m1", "name": "M1"}, {"value": "m2", "name": "M2"}],
        },
    ]
    from projects.session_options import normalize

    Session.objects.filter(pk=session.pk).update(
        config_options=normalize(reported), available_modes=[{"id": "ask", "name": "Ask", "description": ""}]
    )
    page = workbench.new_page()
    open_session(page, session.pk)
    page.get_by_label("Engine", exact=True).wait_for()
    assert page.locator("[data-role=mode-picker]").is_hidden()
    assert page.locator("[data-role=model-picker]").is_hidden()
    page.get_by_label("Approval", exact=True).select_option("auto")
    page.wait_for_selector("[data-role=picker-status]:has-text('Approval: Auto')")
    assert Session.objects.get(pk=session.pk).config == {"mode": "auto"}
