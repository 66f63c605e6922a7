"""The operator's agents as a user may choose them: GET /api/agents, and what their runners learnt.

Design note: docs/agents.md ("The agent catalog"). The entries are the operator's
(settings.HERMESWEB_AGENTS, runs/agents.py); whether one can start here is checked as a runner
would start it (its command on PATH, the sandbox it requires); what the agent says of itself —
its `agentInfo` and `agentCapabilities` — is what its last `initialize` answered a runner, recorded
by the runner each time it starts that agent (`record_initialize`).
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.utils import timezone

from runs.agents import AgentSpec, sandboxed
from runs.models import AgentReport
from runs.redaction import redact

log = logging.getLogger(__name__)

# Names people know the built-in entries by, until an agent reports its own title.
KNOWN_LABELS = {"demo": "Demo agent", "hermes": "Hermes Agent", "codex": "Codex", "claude": "Claude"}


@dataclass
class AgentEntry:
    """One configured agent as GET /api/agents shows it (runs.schemas.AgentOut)."""

    name: str
    label: str
    default: bool
    can_start: bool
    why_not: str
    sandbox: str  # "bubblewrap" | "none" (where it would run now); the entry's setting is `sandbox_setting`
    sandbox_setting: str
    capabilities: dict[str, Any] = field(default_factory=dict)
    agent_info: dict[str, Any] = field(default_factory=dict)
    reported_at: datetime | None = None


def startable(spec: AgentSpec) -> tuple[bool, str, str]:
    """(can start here, why not, where it would run): the checks a runner's start makes first."""
    inside, why_unsandboxed = sandboxed(spec)
    if spec.resolved_command() is None:
        return False, f"its command {spec.command!r} is not installed here (not found or not executable)", ""
    if not inside and spec.sandbox == "required":
        return False, f"it requires the sandbox and {why_unsandboxed}", ""
    return True, "", "bubblewrap" if inside else "none"


def list_agents() -> list[AgentEntry]:
    """Every configured agent, the default first, then by name."""
    reports = {r.agent: r for r in AgentReport.objects.all()}
    default = settings.HERMESWEB_DEFAULT_AGENT
    entries = []
    for name, spec in settings.HERMESWEB_AGENTS.items():
        ok, why, where = startable(spec)
        report = reports.get(name)
        info = report.agent_info if report else {}
        title = info.get("title") if isinstance(info, dict) else None
        entries.append(
            AgentEntry(
                name=name,
                label=str(title or KNOWN_LABELS.get(name) or name),
                default=name == default,
                can_start=ok,
                why_not=why,
                sandbox=where,
                sandbox_setting=spec.sandbox,
                capabilities=report.capabilities if report else {},
                agent_info=info if isinstance(info, dict) else {},
                reported_at=report.reported_at if report else None,
            )
        )
    return sorted(entries, key=lambda e: (not e.default, e.name))


def record_initialize(agent: str, response: dict[str, Any]) -> None:
    """What `agent` answered a runner's `initialize` (its JSON): the latest is kept, one row per agent.

    Called by the runner when it starts an agent process; a failure is logged, never raised: the
    catalog is for people choosing an agent, not something a turn depends on.
    """
    try:
        AgentReport.objects.update_or_create(
            agent=agent,
            defaults={
                "agent_info": redact(response.get("agentInfo") or {}),
                "capabilities": redact(response.get("agentCapabilities") or {}),
                "runner_id": f"{socket.gethostname()}:{os.getpid()}",
                "reported_at": timezone.now(),
            },
        )
    except Exception:
        log.warning("recording what agent %s reported at initialize failed", agent, exc_info=True)
