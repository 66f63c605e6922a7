"""A session's config options: what the agent reports, and the user's choices among them.

Design note: docs/agents.md ("Config options"). ACP's `configOptions` (in the answers to
session/new, load and fork, in `config_option_update`, and in the answer to
session/set_config_option) are the protocol's generic form of mode, model, reasoning effort and
the like: a `select` with values (flat or in groups) or a `boolean`. The runner keeps them on the
Session row in the shape `normalize` gives; the user's choices ({option id: value}) are checked
here (`clean_config`) and reach the agent before the next turn (runs/runner/session_config.py).
"""

from __future__ import annotations

from typing import Any

from projects.refusals import Refused

UNKNOWN_CONFIG_OPTION = "unknown_config_option"
INVALID_CONFIG_VALUE = "invalid_config_value"
# An agent's option list is bookkeeping: past these it is cut, not stored whole.
MAX_OPTIONS = 50
MAX_VALUES = 200


class ConfigRefused(Refused, ValueError):
    """422: a config choice names no option the agent reported, or a value it does not offer."""

    def __init__(self, code: str, message: str) -> None:
        details = [{"field": "config", "location": "body", "message": message, "type": code}]
        super().__init__(422, code, message, details)


def normalize(reported: Any) -> list[dict[str, Any]]:
    """The agent's `configOptions` as stored: [{id, name, description, category, type, current,
    values: [{value, name, description, group}]}] (a select's groups flattened, each value naming
    its group's label); unreadable entries are dropped."""
    options: list[dict[str, Any]] = []
    for raw in reported if isinstance(reported, list) else []:
        if not isinstance(raw, dict) or not raw.get("id") or raw.get("type") not in ("select", "boolean"):
            continue
        category = raw.get("category")
        option: dict[str, Any] = {
            "id": str(raw["id"]),
            "name": str(raw.get("name") or raw["id"]),
            "description": str(raw.get("description") or ""),
            "category": category if isinstance(category, str) else "",
            "type": raw["type"],
        }
        if raw["type"] == "boolean":
            option["current"] = bool(raw.get("currentValue"))
            option["values"] = []
        else:
            option["current"] = str(raw.get("currentValue") or "")
            option["values"] = _select_values(raw.get("options"))
        options.append(option)
    return options[:MAX_OPTIONS]


def _select_values(raw: Any) -> list[dict[str, str]]:
    values: list[dict[str, str]] = []
    for entry in raw if isinstance(raw, list) else []:
        if not isinstance(entry, dict):
            continue
        if isinstance(entry.get("options"), list):  # a group: {group, name, options}
            label = str(entry.get("name") or entry.get("group") or "")
            values += [{**v, "group": label} for v in _select_values(entry["options"])]
        elif entry.get("value") is not None:
            values.append(
                {
                    "value": str(entry["value"]),
                    "name": str(entry.get("name") or entry["value"]),
                    "description": str(entry.get("description") or ""),
                    "group": "",
                }
            )
    return values[:MAX_VALUES]


def clean_config(
    changes: dict[str, Any], options: list[dict[str, Any]], chosen: dict[str, Any]
) -> dict[str, Any]:
    """`chosen` with `changes` applied: each id one of `options`' (else `unknown_config_option`),
    each value one that option offers — a select's value id, a boolean's true/false — or "" /
    None to clear the choice (else `invalid_config_value`). Raises ConfigRefused."""
    by_id = {o.get("id"): o for o in options if isinstance(o, dict)}
    result = dict(chosen)
    for option_id, value in changes.items():
        option = by_id.get(option_id)
        if option is None:
            offered = ", ".join(str(k) for k in by_id) or "none yet (they arrive with the first turn)"
            raise ConfigRefused(
                UNKNOWN_CONFIG_OPTION, f"Unknown config option {option_id!r}; the agent's options: {offered}."
            )
        if value is None or value == "":
            result.pop(option_id, None)
            continue
        if option.get("type") == "boolean":
            if not isinstance(value, bool):
                raise ConfigRefused(INVALID_CONFIG_VALUE, f"Option {option_id!r} takes true or false.")
        elif not isinstance(value, str) or value not in {v.get("value") for v in option.get("values") or []}:
            offered = ", ".join(str(v.get("value")) for v in option.get("values") or [])
            raise ConfigRefused(
                INVALID_CONFIG_VALUE, f"Option {option_id!r} has no value {value!r}; it offers: {offered}."
            )
        result[option_id] = value
    return result


def pending(options: list[dict[str, Any]], chosen: dict[str, Any]) -> list[tuple[dict[str, Any], Any]]:
    """The choices the agent does not have yet: (option, value) where the value differs from its current."""
    by_id = {o.get("id"): o for o in options if isinstance(o, dict)}
    return [
        (by_id[key], value)
        for key, value in chosen.items()
        if key in by_id and value not in (None, "") and by_id[key].get("current") != value
    ]
