"""The demo agent's session config options (ACP `configOptions`, session/set_config_option).

Design note: docs/demo-agent.md ("Config options"). Three options, one of each shape a client
must draw: a flat select (`effort`, category `thought_level`), a grouped select (`voice`) and a
boolean (`verbose`). The chosen values are kept with the session (StoredSession.config) and
shown by `/status`; `/effort <value>` switches the effort from inside a turn and tells the client
with `config_option_update`. A value `refused-*` does not exist, so tests can see a refusal.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from acp import RequestError
from acp.interfaces import Client
from acp.schema import SessionNotification

from .turn import LiveSession, Turn

DEFAULTS: dict[str, Any] = {"effort": "medium", "voice": "plain", "verbose": False}

_EFFORTS = [
    {"value": "low", "name": "Low", "description": "Answer at once."},
    {"value": "medium", "name": "Medium", "description": "Think a little."},
    {"value": "high", "name": "High", "description": "Think hard."},
]
_VOICES = [
    {
        "group": "plain",
        "name": "Plain",
        "options": [{"value": "plain", "name": "Plain"}, {"value": "terse", "name": "Terse"}],
    },
    {"group": "playful", "name": "Playful", "options": [{"value": "pirate", "name": "Pirate"}]},
]


def current(config: dict[str, Any]) -> dict[str, Any]:
    """The session's values: its choices over the defaults."""
    return {**DEFAULTS, **{k: v for k, v in config.items() if k in DEFAULTS}}


def reported(config: dict[str, Any]) -> list[dict[str, Any]]:
    """`configOptions` as the agent reports them, with the session's current values."""
    values = current(config)
    return [
        {
            "id": "effort",
            "name": "Effort",
            "description": "How long the demo pretends to think.",
            "category": "thought_level",
            "type": "select",
            "currentValue": values["effort"],
            "options": _EFFORTS,
        },
        {
            "id": "voice",
            "name": "Voice",
            "type": "select",
            "currentValue": values["voice"],
            "options": _VOICES,
        },
        {
            "id": "verbose",
            "name": "Verbose",
            "description": "Say more about what it does.",
            "type": "boolean",
            "currentValue": values["verbose"],
        },
    ]


def _values(option_id: str) -> set[str]:
    if option_id == "effort":
        return {e["value"] for e in _EFFORTS}
    return {str(v["value"]) for g in _VOICES for v in g["options"]}  # type: ignore[attr-defined]


def chosen(config: dict[str, Any], option_id: str, value: str | bool) -> dict[str, Any]:
    """`config` with `option_id` set to `value`; RequestError invalid_params when there is no such value."""
    if option_id not in DEFAULTS:
        raise RequestError.invalid_params({"configId": option_id, "details": f"no option {option_id!r}"})
    if option_id == "verbose" and not isinstance(value, bool):
        raise RequestError.invalid_params({"configId": option_id, "details": "verbose is true or false"})
    if option_id != "verbose" and (not isinstance(value, str) or value not in _values(option_id)):
        raise RequestError.invalid_params({"configId": option_id, "details": f"no value {value!r}"})
    return {**config, option_id: value}


def describe(config: dict[str, Any]) -> str:
    """For `/status`: `effort=medium, voice=plain, verbose=false`."""
    values = current(config)
    return ", ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items())


def effort_script(conn: Client, live: LiveSession, arg: str) -> Callable[[Turn], Awaitable[None]]:
    """`/effort <value>`: the agent changes an option itself and says so (`config_option_update`)."""

    async def script(turn: Turn) -> None:
        try:
            live.stored.config = chosen(live.stored.config, "effort", arg)
        except RequestError:
            await turn.say(f"No effort {arg!r}.", delay=0)
            return
        update = {"sessionUpdate": "config_option_update", "configOptions": reported(live.stored.config)}
        parsed = SessionNotification.model_validate({"sessionId": live.session_id, "update": update})
        await conn.session_update(session_id=live.session_id, update=parsed.update)
        await turn.say(f"Effort set to {arg}.", delay=0)

    return script
