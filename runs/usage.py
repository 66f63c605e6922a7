"""Usage totals: a session's and each user's, summed from the runs' recorded usage.

Design note: docs/journal.md (`usage.updated`, `usage.final`). Each run keeps the usage its turn
ended with (`Run.usage`: the agent's token counts for the turn by its own keys, and `context`, the
last `usage_update` {used, size, cost}). A session's total sums the token counts over its runs;
its cost is the agent's own cumulative figure (ACP's `usage_update.cost` is the session's total so
far), taken from the latest run that gave one. Read on demand: nothing is kept twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from runs.models import Run

# Keys of Run.usage that are not the turn's token counts.
NOT_TOKENS = frozenset({"context", "session_total"})


@dataclass
class UsageTotal:
    """Usage summed over runs (the API's SessionUsageOut)."""

    runs: int = 0
    tokens: dict[str, int] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)
    cost: dict[str, Any] | None = None


def add_run(total: UsageTotal, usage: dict[str, Any]) -> None:
    """Add one run's recorded usage to `total` (runs in the order they ran)."""
    counted = False
    for key, value in usage.items():
        if key not in NOT_TOKENS and isinstance(value, int) and not isinstance(value, bool):
            total.tokens[key] = total.tokens.get(key, 0) + value
            counted = True
    total.runs += counted
    context = usage.get("context")
    if isinstance(context, dict) and context:
        total.context = context
        cost = context.get("cost")
        if isinstance(cost, dict) and isinstance(cost.get("amount"), int | float):
            total.cost = {"amount": cost["amount"], "currency": str(cost.get("currency") or "")}


def total_of(usages: Iterable[dict[str, Any]]) -> UsageTotal:
    total = UsageTotal()
    for usage in usages:
        if isinstance(usage, dict):
            add_run(total, usage)
    return total


def session_usage(session_id: int) -> UsageTotal:
    """The session's usage so far (runs that ended; a running turn's shows once it ends)."""
    rows = Run.objects.filter(session_id=session_id).exclude(usage={}).order_by("created_at", "id")
    return total_of(rows.values_list("usage", flat=True).iterator())


@dataclass
class UserUsage:
    """One user's usage over all their sessions: tokens summed, and the sessions' costs by currency."""

    tokens: dict[str, int] = field(default_factory=dict)
    costs: dict[str, float] = field(default_factory=dict)
    runs: int = 0


def user_usage(user_id: int) -> UserUsage:
    """Every session of the user's projects: tokens over all runs, each session's last cost added."""
    rows = (
        Run.objects.filter(session__project__owner_id=user_id)
        .exclude(usage={})
        .order_by("session_id", "created_at", "id")
        .values_list("session_id", "usage")
    )
    result = UserUsage()
    by_session: dict[int, UsageTotal] = {}
    for session_id, usage in rows.iterator():
        if isinstance(usage, dict):
            add_run(by_session.setdefault(session_id, UsageTotal()), usage)
    for total in by_session.values():
        result.runs += total.runs
        for key, value in total.tokens.items():
            result.tokens[key] = result.tokens.get(key, 0) + value
        if total.cost:
            currency = total.cost["currency"] or "?"
            result.costs[currency] = result.costs.get(currency, 0.0) + float(total.cost["amount"])
    return result


def describe(usage: UserUsage) -> str:
    """A line for the admin: total tokens, input/output, cost."""
    tokens = usage.tokens
    total = tokens.get("totalTokens") or sum(tokens.get(k, 0) for k in ("inputTokens", "outputTokens"))
    parts = [f"{total:,} tokens"]
    if "inputTokens" in tokens or "outputTokens" in tokens:
        parts.append(f"in {tokens.get('inputTokens', 0):,} · out {tokens.get('outputTokens', 0):,}")
    parts += [f"{amount:.4f} {currency}" for currency, amount in sorted(usage.costs.items())]
    parts.append(f"{usage.runs} turns")
    return " · ".join(parts)
