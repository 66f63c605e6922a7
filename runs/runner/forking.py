"""A forked session's first turn: ask the agent for `session/fork` of the parent's agent session.

Design note: docs/agents.md ("Fork"). The web side (runs/fork.py) copied the parent's turns
into the journal and left the parent's ACP session id in `fork_agent_session_id`; here the
agent makes the new agent session, which then serves the run like a loaded one. An agent
that cannot fork (any more) gets a new session instead, and the turn says so.
"""

from __future__ import annotations

import dataclasses
import logging

import acp

from runs.journal import NewEvent
from runs.journal.payloads import Progress
from runs.models import EventType
from runs.runner.agents import AgentProcess
from runs.runner.claims import RunContext
from runs.runner.connections import retried
from runs.runner.session_rows import store_forked_session
from runs.runner.writer import JournalWriter

log = logging.getLogger(__name__)

FORK_TIMEOUT = 120.0  # as session/new and session/load: Hermes copies the history it stored


def can_fork(process: AgentProcess) -> bool:
    return "fork" in (process.capabilities.get("session_capabilities") or {})


async def forked_context(process: AgentProcess, context: RunContext, writer: JournalWriter) -> RunContext:
    """`context` with the agent session `session/fork` opened, when the run is a fork's first turn.

    Otherwise `context` as it is: the execution then opens a new agent session, after a
    `progress` event saying the earlier conversation is not in the agent's context.
    """
    parent = context.fork_agent_session_id
    if not parent or context.agent_session_id:
        return context
    if not can_fork(process):
        _say(writer, "The agent cannot fork sessions; starting a new one without the earlier context.")
        return context
    try:
        response = await process.call(
            process.conn.fork_session(cwd=context.cwd, session_id=parent, mcp_servers=[]), FORK_TIMEOUT
        )
    except acp.RequestError as exc:
        log.warning("run %s: session/fork of %s refused: %s", context.run_id, parent, exc)
        _say(writer, f"The agent could not fork the session ({exc}); starting a new one without it.")
        return context
    forked = response.session_id
    process.loaded.add(forked)
    inherit_model(process, parent, forked)
    await retried(store_forked_session, context.session_id, forked)
    return dataclasses.replace(context, agent_session_id=forked, fork_agent_session_id="")


def inherit_model(process: AgentProcess, parent: str, forked: str) -> None:
    """A fork answer naming no models (codex-acp's) keeps the parent's, as this process knows them.

    Else the turn re-sends the inherited model, and Codex refuses set_model for a model outside its
    catalog (a custom provider's): the fork's first turn would fail `model_refused`.
    """
    known = process.configs.get(parent)
    config = process.configs.get(forked)
    if known is None or config is None or config.models or config.current_model:
        return
    config.models = list(known.models)
    config.current_model = known.current_model


def _say(writer: JournalWriter, text: str) -> None:
    writer.add([NewEvent(EventType.PROGRESS, Progress(text=text))])
