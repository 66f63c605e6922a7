"""A session's mode and model: what the agent reports, and what the user chose, applied before a turn.

Design note: docs/agents.md ("Modes and models"). The agent reports its modes and models in
the answers to session/new, session/load and session/fork (read raw by the transport,
runs/runner/stdio.py: the typed SDK 0.12 drops `models`), and a mode it switches to itself in
`current_mode_update`. Each agent process keeps, per agent session, what the agent has now
(`AgentSessionConfig`). Before each prompt the session's chosen mode and model (the Session
row's `mode`/`model`, read when the run was claimed) are sent with `session/set_mode` and
`session/set_model` when they differ from that; a refusal fails the turn with a clear code.

Config options (docs/agents.md, "Config options"): ACP's generic `configOptions` come in the same
answers, in `config_option_update` and in set_config_option's answer; they are kept per agent
session like the modes and stored on the Session row. The user's choices (Session.config, read
just before the prompt) differing from the agent's current values go out with
`session/set_config_option`, one by one; a refusal fails the turn with `config_refused`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import acp

from projects.session_options import normalize, pending
from runs.runner.config_rows import read_config_choices, store_config_options
from runs.runner.connections import retried
from runs.runner.session_rows import store_agent_config
from runs.runner.stdio import AgentDied

# A set_mode / set_model is a quick bookkeeping call; an agent silent this long is stuck.
CONFIG_TIMEOUT = 30.0
MODE_REFUSED = "mode_refused"
MODEL_REFUSED = "model_refused"
CONFIG_REFUSED = "config_refused"


@dataclass
class AgentSessionConfig:
    """One agent session's modes and models as this agent process knows them."""

    modes: list[dict[str, str]] = field(default_factory=list)
    models: list[dict[str, str]] = field(default_factory=list)
    current_mode: str = ""
    current_model: str = ""
    reported: bool = False  # the agent said something (modes or models) not yet on the Session row
    # Its config options (projects.session_options.normalize's shape), and whether the Session
    # row lacks what it last said of them.
    options: list[dict[str, Any]] = field(default_factory=list)
    options_reported: bool = False


class Refusal(NamedTuple):
    """Why the turn cannot run with the session's chosen mode or model."""

    code: str
    message: str


class ConfigTarget(Protocol):
    """What applying a config needs of an agent process (runs.runner.agents.AgentProcess)."""

    configs: dict[str, AgentSessionConfig]
    poisoned: str

    async def call(self, coro: Any, timeout: float | None = None) -> Any: ...

    async def raw_request(self, method: str, params: dict[str, Any]) -> Any: ...


class TurnConfig(Protocol):
    """What a run asks for (runs.runner.claims.RunContext)."""

    session_id: int
    mode: str
    model: str


def parse_opened(result: dict[str, Any]) -> AgentSessionConfig:
    """The modes and models of a session/new, load or fork answer (ACP `modes`; Hermes' `models`)."""
    modes_state = result.get("modes") if isinstance(result.get("modes"), dict) else {}
    models_state = result.get("models") if isinstance(result.get("models"), dict) else {}
    modes = [
        {
            "id": str(m["id"]),
            "name": str(m.get("name") or m["id"]),
            "description": str(m.get("description") or ""),
        }
        for m in modes_state.get("availableModes") or []
        if isinstance(m, dict) and m.get("id")
    ]
    models = [
        {"id": str(m["modelId"]), "name": str(m.get("name") or m["modelId"])}
        for m in models_state.get("availableModels") or []
        if isinstance(m, dict) and m.get("modelId")
    ]
    options = normalize(result.get("configOptions"))
    return AgentSessionConfig(
        modes=modes,
        models=models,
        current_mode=str(modes_state.get("currentModeId") or ""),
        current_model=str(models_state.get("currentModelId") or ""),
        reported=bool(modes or models),
        options=options,
        options_reported=bool(options),
    )


def record_opened(
    configs: dict[str, AgentSessionConfig], agent_session_id: str, result: dict[str, Any]
) -> None:
    """Keep what a session-opening answer says (called by the transport as the answer arrives)."""
    configs[agent_session_id] = parse_opened(result)


def record_mode_update(
    configs: dict[str, AgentSessionConfig], agent_session_id: str, update: dict[str, Any]
) -> str:
    """A `current_mode_update`: the mode the agent switched to (kept), or "" if it names none."""
    mode = str(update.get("currentModeId") or update.get("modeId") or "")
    if mode:
        configs.setdefault(agent_session_id, AgentSessionConfig()).current_mode = mode
    return mode


def record_config_update(
    configs: dict[str, AgentSessionConfig], agent_session_id: str, update: dict[str, Any]
) -> None:
    """A `config_option_update` (the full set, with current values): kept, to be stored."""
    config = configs.setdefault(agent_session_id, AgentSessionConfig())
    config.options = normalize(update.get("configOptions"))
    config.options_reported = True


async def store_reported_options(process: ConfigTarget, agent_session_id: str, session_id: int) -> None:
    """Store the config options the agent last reported, if the Session row lacks them."""
    config = process.configs.get(agent_session_id)
    if config is not None and config.options_reported:
        config.options_reported = False
        await retried(store_config_options, session_id, config.options)


async def prepare_turn(process: ConfigTarget, agent_session_id: str, turn: TurnConfig) -> Refusal | None:
    """Before the prompt: store what the agent reported on the Session row, then apply the chosen
    mode and model. None when the turn may run; a Refusal (the run fails with it) otherwise.

    Preconditions: the agent session is open in `process` (new, loaded or forked).
    """
    config = process.configs.setdefault(agent_session_id, AgentSessionConfig())
    if config.reported:
        config.reported = False
        await retried(
            store_agent_config,
            turn.session_id,
            config.modes,
            config.models,
            config.current_mode,
            config.current_model,
        )
    if turn.mode and turn.mode != config.current_mode:
        refused = await _send(
            process, "session/set_mode", {"sessionId": agent_session_id, "modeId": turn.mode}
        )
        if refused:
            return Refusal(MODE_REFUSED, f"The agent refused mode {turn.mode!r}: {refused}")
        config.current_mode = turn.mode
    if turn.model and turn.model != config.current_model:
        refused = await _send(
            process, "session/set_model", {"sessionId": agent_session_id, "modelId": turn.model}
        )
        if refused:
            return Refusal(MODEL_REFUSED, f"The agent refused model {turn.model!r}: {refused}")
        config.current_model = turn.model
    return await _apply_options(process, agent_session_id, turn.session_id)


async def _apply_options(process: ConfigTarget, agent_session_id: str, session_id: int) -> Refusal | None:
    """The session's config choices the agent does not have yet, sent one by one."""
    await store_reported_options(process, agent_session_id, session_id)
    config = process.configs[agent_session_id]
    if not config.options:
        return None  # nothing reported, so nothing can have been chosen (projects.session_options)
    chosen = await retried(read_config_choices, session_id)
    for option, value in pending(config.options, chosen):
        params: dict[str, Any] = {"sessionId": agent_session_id, "configId": option["id"], "value": value}
        if isinstance(value, bool):
            params["type"] = "boolean"
        answer: dict[str, Any] = {}
        refused = await _send(process, "session/set_config_option", params, answer)
        if refused:
            return Refusal(CONFIG_REFUSED, f"The agent refused {option['id']} = {value!r}: {refused}")
        option["current"] = value
        if isinstance(answer.get("configOptions"), list):  # the full set as it is now
            record_config_update(process.configs, agent_session_id, answer)
        else:
            config.options_reported = True
        config = process.configs[agent_session_id]
    await store_reported_options(process, agent_session_id, session_id)
    return None


async def _send(
    process: ConfigTarget, method: str, params: dict[str, Any], answer: dict[str, Any] | None = None
) -> str:
    """ "" when the agent accepted (its answer's fields into `answer`); else why not, in words."""
    try:
        result = await process.call(process.raw_request(method, params), CONFIG_TIMEOUT)
        if answer is not None and isinstance(result, dict):
            answer.update(result)
    except acp.RequestError as exc:
        detail = exc.data.get("details") if isinstance(exc.data, dict) else None
        return f"{exc} ({detail})" if detail else str(exc) or f"error {exc.code}"
    except TimeoutError:
        process.poisoned = f"{method} not answered"  # stuck: the next turn gets a fresh process
        return f"no answer to {method} within {CONFIG_TIMEOUT:.0f} s"
    except AgentDied as exc:
        return f"the agent process exited ({exc})"
    return ""
