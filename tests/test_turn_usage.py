"""Per-turn usage from an agent that reports a running session total (Hermes)."""

from __future__ import annotations

from runs.runner.translate import per_turn_usage


def test_a_running_total_becomes_the_turns_difference() -> None:
    assert per_turn_usage({"totalTokens": 150}, {"totalTokens": 100}, cumulative=True) == {"totalTokens": 50}


def test_a_total_that_fell_restarted_with_a_fresh_agent_process_and_is_the_turns_own() -> None:
    # After session/load in a new process Hermes counts from zero again (tests/fixtures/hermes/reload).
    usage = {"inputTokens": 10, "outputTokens": 5, "totalTokens": 15}
    previous = {"inputTokens": 20, "outputTokens": 10, "totalTokens": 30}

    assert per_turn_usage(usage, previous, cumulative=True) == usage


def test_without_a_previous_total_or_for_per_turn_agents_usage_is_kept() -> None:
    assert per_turn_usage({"totalTokens": 150}, None, cumulative=True) == {"totalTokens": 150}
    assert per_turn_usage({"totalTokens": 150}, {"totalTokens": 100}, cumulative=False) == {
        "totalTokens": 150
    }
