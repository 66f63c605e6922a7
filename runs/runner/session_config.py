"""A session's mode and model: what the agent reports, and what the user chose, applied before a turn.

Design note: docs/agents.md ("Modes and models"). The agent reports its modes and models in
the answers to session/new, session/load and session/fork (read raw by the transport,
runs/runner/stdio.py: the typed SDK 0.12 drops `models`), and a mode it switches to itself in
`current_mode_update`. Each agent process keeps, per agent session, what the agent has now
(`AgentSessionConfig`). Before each prompt the session's chosen mode and model (the Session
row's `mode`/`model`, read when the run was claimed) are sent with `session/set_mode` and
`session/set_model` when they differ from that; a refusal fails the turn with a clear code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import acp

from runs.runner.connections import retried
from runs.runner.session_rows import store_agent_config
from runs.runner.stdio import AgentDied

# A set_mode / set_model is a quick bookkeeping call; an agent silent this long is stuck.
CONFIG_TIMEOUT = 30.0
MODE_REFUSED = "mode_refused"
MODEL_REFUSED = "model_refused"


@dataclass
class AgentSessionConfig:
    """One agent session's modes and models as this agent process knows them."""

    modes: list[dict[str, str]] = field(default_factory=list)
    models: list[dict[str, str]] = field(default_factory=list)
    current_mode: str = ""
    current_model: str = ""
    reported: bool = False  # the agent said something (modes or models) not yet on the Session row


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
    return AgentSessionConfig(
        modes=modes,
        models=models,
        current_mode=str(modes_state.get("currentModeId") or ""),
        current_model=str(models_state.get("currentModelId") or ""),
        reported=bool(modes or models),
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
    return None


async def _send(process: ConfigTarget, method: str, params: dict[str, Any]) -> str:
    """ "" when the agent accepted; else why not, in words."""
    try:
        await process.call(process.raw_request(method, params), CONFIG_TIMEOUT)
    except acp.RequestError as exc:
        detail = exc.data.get("details") if isinstance(exc.data, dict) else None
        return f"{exc} ({detail})" if detail else str(exc) or f"error {exc.code}"
    except TimeoutError:
        process.poisoned = f"{method} not answered"  # stuck: the next turn gets a fresh process
        return f"no answer to {method} within {CONFIG_TIMEOUT:.0f} s"
    except AgentDied as exc:
        return f"the agent process exited ({exc})"
    return ""
