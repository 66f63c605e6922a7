"""Warm agents (issue 43): the first turn after an idle period need not wait for the agent to start.

- A session whose agent was stopped (its runner restarted since its last turn) is opened:
  the web's warm-up request (`runs.warm_requests.do_request_warm`, what the page's
  `POST /api/sessions/{id}/warm` does), then 2 s later a turn ("fast …"): its first token,
  as a ratio to a warm session's first token (the same session's next turn) in the same run
  (target ≤ 1.2x). Beside it, for information, a stopped session's first token with no warm-up.
- RSS per idle agent process (its whole tree: bwrap, the agent and its children, as the
  memory budget counts it, runs/runner/memory.py) for each real agent available — Hermes
  (bin/setup-hermes), and Codex and Claude when configured and installed (skipped otherwise) —
  and the sessions per GiB of runner host memory that makes at the default budget
  (HERMESWEB_AGENT_MEMORY_MB): one idle agent process per project serves all its sessions, so
  this counts sessions in projects of their own, the least it can be.

The demo agent, and Hermes offline against a scripted model that answers at once. PostgreSQL +
Redis; a real runner. First token: the first `token.delta` row's commit time minus the submit's.

usage: python bench/warm.py [--quick] [--agents demo,hermes,codex,claude] [--json FILE]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _support as S

PROMPT = "fast what is in this project"
OPEN_TO_SEND_SECONDS = 2.0
WARMED_OF_WARM = 1.2
READ_PAUSE_SECONDS = 0.3


def submit(session: Any, text: str) -> tuple[int, float]:
    from runs.services import do_submit_message

    at = time.time()
    run = do_submit_message(session, client_id=uuid.uuid4().hex, text=text, mode="auto").run
    assert run is not None
    return run.pk, at


def first_token(run_id: int, submitted: float, timeout: float = 180.0) -> float:
    """Seconds from the submit to the run's first token, once the run has ended."""
    from runs.models import EventType, JournalEvent, Run

    deadline = time.monotonic() + timeout
    while not Run.objects.filter(pk=run_id, finished_at__isnull=False).exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"run {run_id} did not finish")
        time.sleep(0.02)
    event = JournalEvent.objects.filter(run_id=run_id, type=EventType.TOKEN_DELTA).order_by("seq").first()
    if event is None:
        raise RuntimeError(f"run {run_id} wrote no token")
    return event.created_at.timestamp() - submitted


def turn(session: Any) -> float:
    return first_token(*submit(session, PROMPT))


def warm_request(session: Any) -> None:
    from runs.warm_requests import do_request_warm, recent_requests

    recent_requests.clear()  # each request here is a page opened in another process
    answer = do_request_warm(session)
    if not answer.requested:
        raise RuntimeError(f"session {session.pk}: no warm-up ({answer.reason})")


def idle_agent_rss_mib(runner: S.Proc) -> list[float]:
    """RSS of each agent process tree under the runner (its children), in MiB."""
    from runs.runner.memory import tree_rss

    roots = S.children(runner.pid)
    return [size / 2**20 for size in tree_rss(roots).values() if size > 0]


def wait_started(runner_id: str, agent: str, timeout: float = 120.0) -> bool:
    """Whether the runner reported the agent's `initialize` (its capabilities on the runner row)."""
    from runs.models import Runner

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        caps = Runner.objects.filter(pk=runner_id).values_list("agent_capabilities", flat=True).first()
        if caps and agent in caps:
            return True
        time.sleep(0.1)
    return False


def measure_turns(bench: S.BenchEnv, owner: Any, agent: str, rounds: int) -> dict[str, Any]:
    """First tokens: warmed 2 s before, warm, and (information) stopped with no warm-up."""
    log_dir = bench.data_dir / "logs"
    log_dir.mkdir(exist_ok=True)
    # Each session in a project of its own: a project's agent process serves all its sessions.
    warmed = [S.make_session(owner, agent, f"warmed-{agent}") for _ in range(rounds)]
    cold = [S.make_session(owner, agent, f"cold-{agent}") for _ in range(rounds)]
    before = S.start_runner(bench.env, log_dir, runner_id=f"before-{agent}")
    try:
        for session in warmed + cold:  # a first turn: each session has an agent session to load
            turn(session)
    finally:
        before.stop()
    runner_id = f"warm-{agent}"
    runner = S.start_runner(bench.env, log_dir, runner_id=runner_id)
    out: dict[str, Any] = {"warmed": [], "warm": [], "cold": []}
    try:
        from runs.models import Runner

        S.wait_for(lambda: Runner.objects.filter(pk=runner_id).exists(), 60, what="the runner")
        for opened, stopped in zip(warmed, cold, strict=True):
            opened.refresh_from_db()
            warm_request(opened)
            time.sleep(OPEN_TO_SEND_SECONDS)
            out["warmed"].append(turn(opened))
            time.sleep(READ_PAUSE_SECONDS)
            out["warm"].append(turn(opened))
            time.sleep(READ_PAUSE_SECONDS)
            out["cold"].append(turn(stopped))
        time.sleep(2.0)  # the last turn's tail (the agent saving its session) settles
        out["rss"] = idle_agent_rss_mib(runner)
    finally:
        runner.stop()
    return out


def measure_rss_only(bench: S.BenchEnv, owner: Any, agent: str) -> list[float]:
    """An agent's idle process, started by a warm-up (spawn, initialize), measured after 3 s."""
    log_dir = bench.data_dir / "logs"
    log_dir.mkdir(exist_ok=True)
    runner_id = f"rss-{agent}"
    runner = S.start_runner(bench.env, log_dir, runner_id=runner_id)
    try:
        warm_request(S.make_session(owner, agent, f"rss-{agent}"))
        if not wait_started(runner_id, agent):
            S.log(f"warm: {agent} did not start; skipped\n{runner.log()}")
            return []
        time.sleep(3.0)
        return idle_agent_rss_mib(runner)
    finally:
        runner.stop()


def turn_rows(agent: str, got: dict[str, Any]) -> list[S.Row]:
    ms = {k: 1000 * S.percentile(got[k], 50) for k in ("warmed", "warm", "cold")}
    S.log(
        f"warm: {agent} p50 first token warmed {ms['warmed']:.0f} ms, "
        f"warm {ms['warm']:.0f}, cold {ms['cold']:.0f}"
    )
    opened = f"{OPEN_TO_SEND_SECONDS:g} s after opening a stopped session"
    return [
        S.ratio_row(
            "warm",
            f"{agent}: p50 first token {opened} ÷ a warm session's",
            ms["warmed"],
            ms["warm"],
            unit="ms",
            limit=WARMED_OF_WARM,
            at_most=True,
        ),
        S.Row(
            bench="warm",
            figure=f"{agent}: p50 first token in a stopped session, no warm-up",
            value=ms["cold"],
            unit="ms",
            higher_is_better=False,
            baseline="a warm session",
            baseline_value=ms["warm"],
        ),
    ]


def memory_rows(agent: str, rss: list[float], budget_mib: int) -> list[S.Row]:
    per_agent = S.percentile(rss, 50)
    fit = int(budget_mib // per_agent)
    return [
        S.Row(
            bench="warm",
            figure=f"{agent}: RSS per idle agent process (its tree)",
            value=per_agent,
            unit="MiB",
            higher_is_better=False,
            note=f"{len(rss)} process(es)",
        ),
        S.Row(
            bench="warm",
            figure=f"{agent}: sessions per GiB at the default budget ({budget_mib} MB a runner)",
            value=1024 / per_agent,
            unit="",
            higher_is_better=True,
            note=f"{fit} idle agents fit the budget; a project's sessions share one",
        ),
    ]


def available(agent: str) -> bool:
    from django.conf import settings

    spec = settings.HERMESWEB_AGENTS.get(agent)
    return spec is not None and spec.resolved_command() is not None


def main() -> None:
    parser = S.arguments(__doc__)
    parser.add_argument("--agents", default="demo,hermes,codex,claude")
    args = parser.parse_args()
    wanted = [a.strip() for a in args.agents.split(",") if a.strip()]
    rounds = 3 if args.quick else 5
    extra: dict[str, str] = {"HERMESWEB_DEMO_DELAY": "0.01"}
    llm = None
    if "hermes" in wanted:
        from tests.support.hermes import hermes_acp_path, hermes_agent_config
        from tests.support.scripted_llm import ScriptedLLM

        if hermes_acp_path() is None:
            S.log("warm: hermes-acp is not installed (bin/setup-hermes); Hermes skipped")
            wanted.remove("hermes")
        else:
            llm = ScriptedLLM().start()
            root = Path(tempfile.mkdtemp(prefix="hermesweb-bench-warm-hermes-"))
            extra["HERMESWEB_AGENTS"] = json.dumps({"hermes": hermes_agent_config(root, llm)})
    bench = S.setup("postgres", redis=True, name="warm", **extra)
    from django.conf import settings

    owner = S.make_owner("warm")
    rows: list[S.Row] = []
    try:
        for agent in wanted:
            if not available(agent):
                S.log(f"warm: agent {agent!r} is not configured or not installed here; skipped")
                continue
            if agent in ("demo", "hermes"):
                S.log(f"warm: {agent}, {rounds} rounds")
                got = measure_turns(bench, owner, agent, rounds)
                rows += turn_rows(agent, got)
                rss = got["rss"]
            else:
                rss = measure_rss_only(bench, owner, agent)
            if agent != "demo" and rss:  # the demo agent is no real agent's size
                rows += memory_rows(agent, rss, settings.HERMESWEB_AGENT_MEMORY_MB)
    finally:
        if llm is not None:
            llm.stop()
    S.emit(rows, args.json)


if __name__ == "__main__":
    main()
