"""Fair turns across users (issue 43): one user's forty queued turns must not make another wait.

- User A submits 40 turns at once (40 sessions; the demo agent types each answer at
  HERMESWEB_DEMO_DELAY), then user B submits one ("fast …", no typing delay): B's first token,
  as a ratio to B's first token on an idle runner in the same run (target ≤ 1.5x).
- A's throughput (turns completed per second, from the submit to the last `done`) with B's
  turns beside it, against A alone in the same run (target ≥ 0.9x).

One runner (PostgreSQL + Redis), HERMESWEB_MAX_ACTIVE_RUNS_PER_USER at its default (4). First
token: the first `token.delta` row's commit time minus the submit's (same host, same clock),
so the bench's own polling for "done" adds nothing to it.

usage: python bench/fairness.py [--quick] [--json FILE]
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _support as S

A_TURNS = 40
B_PROMPT = "fast what is in this project"
A_PROMPT = "tell me about this project"  # typed: a turn that takes a while, as real ones do
B_FIRST_TOKEN_OF_IDLE = 1.5
A_THROUGHPUT_OF_ALONE = 0.9


def submit(session: Any, text: str) -> tuple[int, float]:
    from runs.services import do_submit_message

    at = time.time()
    run = do_submit_message(session, client_id=uuid.uuid4().hex, text=text, mode="auto").run
    assert run is not None
    return run.pk, at


def wait_done(run_ids: list[int], timeout: float = 600.0) -> float:
    """When the last of these runs finished (its `finished_at`), once all have."""
    from runs.models import Run, RunStatus

    deadline = time.monotonic() + timeout
    while True:
        rows = list(Run.objects.filter(pk__in=run_ids).values_list("status", "finished_at"))
        if all(finished for _, finished in rows):
            bad = [status for status, _ in rows if status != RunStatus.COMPLETED]
            if bad:
                raise RuntimeError(f"runs ended {bad}")
            return max(finished for _, finished in rows).timestamp()
        if time.monotonic() > deadline:
            raise RuntimeError("timed out waiting for the runs to finish")
        time.sleep(0.02)


def first_token(run_id: int, submitted: float) -> float:
    from runs.models import EventType, JournalEvent

    event = JournalEvent.objects.filter(run_id=run_id, type=EventType.TOKEN_DELTA).order_by("seq").first()
    if event is None:
        raise RuntimeError(f"run {run_id} wrote no token")
    return event.created_at.timestamp() - submitted


CLAIM_WAITS: dict[str, list[float]] = {}


def b_turns(sessions: list[Any], count: int, phase: str = "") -> list[float]:
    """B's turns one after another (each in a session of its own): their first tokens, seconds.
    How long each sat queued before a runner claimed it goes to CLAIM_WAITS[phase]."""
    from runs.models import Run

    out = []
    for session in sessions[:count]:
        run_id, at = submit(session, B_PROMPT)
        wait_done([run_id])
        out.append(first_token(run_id, at))
        run = Run.objects.get(pk=run_id)
        assert run.started_at is not None
        CLAIM_WAITS.setdefault(phase, []).append((run.started_at - run.created_at).total_seconds())
        time.sleep(0.2)  # a person reads the answer before sending the next
    return out


def a_burst(
    sessions: list[Any], b_sessions: list[Any] | None = None, b_count: int = 0
) -> tuple[float, list[float]]:
    """A's 40 turns at once (then B's, one after another, while A's are in flight): A's turns
    per second, and B's first tokens."""
    started = time.time()
    runs = [submit(session, A_PROMPT)[0] for session in sessions]
    b = b_turns(b_sessions, b_count, "beside") if b_sessions else []
    last = wait_done(runs)
    return len(runs) / (last - started), b


def main() -> None:
    parser = S.arguments(__doc__)
    args = parser.parse_args()
    b_count = 3 if args.quick else 7
    bench = S.setup("postgres", redis=True, name="fairness", HERMESWEB_DEMO_DELAY="0.01")
    alice, bob = S.make_owner("alice"), S.make_owner("bob")
    a_project, b_project = S.make_project(alice, name="a"), S.make_project(bob, name="b")
    rounds = 2  # alone, then with B
    a_sessions = [[S.make_session(alice, project=a_project) for _ in range(A_TURNS)] for _ in range(rounds)]
    b_sessions = [S.make_session(bob, project=b_project) for _ in range(3 * b_count + 2)]
    log_dir = bench.data_dir / "logs"
    log_dir.mkdir(exist_ok=True)
    runner = S.start_runner(bench.env, log_dir, runner_id="bench-fairness")
    try:
        # Warm both users' agents (spawn, initialize): what follows measures turns, not starts.
        b_turns(b_sessions[:2], 2)
        submitted = submit(a_sessions[0][0], "fast hello")
        wait_done([submitted[0]])
        S.log(f"fairness: B alone, {b_count} turns on an idle runner")
        idle = b_turns(b_sessions[2:], b_count, "idle")
        S.log(f"fairness: A alone, {A_TURNS} turns at once")
        alone, _ = a_burst(a_sessions[0])
        S.log(f"fairness: A's {A_TURNS} turns at once, then B's {b_count} one after another")
        contended, beside = a_burst(a_sessions[1], b_sessions[2 + b_count :], b_count)
    finally:
        runner.stop()

    def ms(values: list[float], q: float) -> float:
        return 1000 * S.percentile(values, q)

    S.log(
        f"fairness: B first token idle p50 {ms(idle, 50):.1f} ms, beside A's 40 p50 {ms(beside, 50):.1f} ms; "
        f"A {alone:.2f} turns/s alone, {contended:.2f} with B"
    )
    rows = [
        S.Row(
            bench="fairness",
            figure=f"p50 B's first token while A's {A_TURNS} queued turns run",
            value=ms(beside, 50),
            unit="ms",
            higher_is_better=False,
            ceiling="B on an idle runner",
            ceiling_value=ms(idle, 50),
            note=(
                f"queued before its claim p50 {ms(CLAIM_WAITS['beside'], 50):.1f} ms beside A's, "
                f"{ms(CLAIM_WAITS['idle'], 50):.1f} ms idle: the rest is the busy machine, not the queue"
            ),
        ),
        S.ratio_row(
            "fairness",
            f"p50 B's first token beside A's {A_TURNS} ÷ on an idle runner",
            ms(beside, 50),
            ms(idle, 50),
            unit="ms",
            limit=B_FIRST_TOKEN_OF_IDLE,
            at_most=True,
        ),
        S.ratio_row(
            "fairness",
            f"A's throughput ({A_TURNS} turns at once) with B's turns ÷ A alone",
            contended,
            alone,
            unit="turns/s",
            limit=A_THROUGHPUT_OF_ALONE,
            at_most=False,
        ),
    ]
    S.emit(rows, args.json)


if __name__ == "__main__":
    main()
