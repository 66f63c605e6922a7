"""A long session in the browser: the session page of a finished 100k-event run, in chromium.

The run is bench/replay.py's (`build_run`: token deltas, a tool update every 20th event, written
through the journal) on the embedded default (SQLite, no Redis), served by a real daphne.
Playwright drives Debian's chromium (/usr/bin/chromium, headless); each load is a fresh
browser context, timed from navigation start (the page's `performance.now()`):
- interactive: the workbench says it is ready (`#workbench[data-ready=true]`: transcript
  loaded, socket started, composer usable) — read in the page, so it is also when the main
  thread was free to answer;
- bottom: the run's rendered markdown is in place (`[data-rendered=true]`) and the transcript
  is scrolled to its end.
Long tasks (PerformanceObserver) are summed beside them. The baseline is the same page for a
session whose one run has 10 events, loaded alternately with the long one.

usage: python bench/transcript_page.py [--events 100000] [--loads 3] [--quick] [--json FILE]
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _support as S

# Issue #25 (from issue #24): a 100k-event run's page, interactive within 1 s, at the bottom within 2 s.
TARGET_INTERACTIVE_MS = 1000.0
TARGET_BOTTOM_MS = 2000.0
TIMEOUT_MS = 60_000

LONG_TASKS = """
window.__long = [];
new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) window.__long.push(entry.duration);
}).observe({ type: 'longtask', buffered: true });
"""
RESOURCES = """() => {
  const out = {};
  for (const e of performance.getEntriesByType('resource')) {
    const name = e.name.includes('/transcript') ? 'transcript'
      : e.name.includes('/fragment') ? 'fragments' : null;
    if (name) out[name] = {
      ms: e.responseEnd - e.startTime, wait: e.responseStart - e.requestStart, kib: e.transferSize / 1024,
    };
  }
  return out;
}"""
READY = "() => document.querySelector('#workbench[data-ready=\"true\"]') ? performance.now() : false"
BOTTOM = """() => {
  const el = document.querySelector('[data-role=scroller]');
  const done = document.querySelector('[data-rendered="true"]');
  return done && el && el.scrollHeight - el.scrollTop - el.clientHeight < 24 ? performance.now() : false;
}"""


def load(browser: Any, base_url: str, cookie: str, session_id: int) -> dict[str, float]:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    context = browser.new_context(base_url=base_url, viewport={"width": 1280, "height": 860})
    try:
        context.add_cookies([{"name": "sessionid", "value": cookie, "url": base_url}])
        context.add_init_script(LONG_TASKS)
        page = context.new_page()
        page.goto(f"/sessions/{session_id}/", wait_until="commit", timeout=TIMEOUT_MS)
        ready = bottom = math.nan  # not there within TIMEOUT_MS: a MISS, with what it waited on
        with contextlib.suppress(PlaywrightTimeout):
            ready = page.wait_for_function(READY, timeout=TIMEOUT_MS, polling=10).json_value()
            bottom = page.wait_for_function(BOTTOM, timeout=TIMEOUT_MS, polling=10).json_value()
        tasks = page.evaluate("() => window.__long")
        # Where the time went: the two reads the page waits on (the transcript, the rendered turns).
        reads = page.evaluate(RESOURCES)
        return {
            "interactive": float(ready),
            "bottom": float(bottom),
            "long_total": float(sum(tasks)),
            "long_max": float(max(tasks, default=0.0)),
            "dom_nodes": float(page.evaluate("() => document.getElementsByTagName('*').length")),
            **{
                f"{name}_{key}": float(value) for name, entry in reads.items() for key, value in entry.items()
            },
        }
    finally:
        context.close()


def reads_note(loads: list[dict[str, float]]) -> str:
    """The transcript's and the fragments' requests: total ms, of which the server's wait, and size."""
    parts = []
    for name in ("transcript", "fragments"):
        if f"{name}_ms" in loads[0]:
            ms, wait, kib = (
                S.percentile([t.get(f"{name}_{k}", 0.0) for t in loads], 50) for k in ("ms", "wait", "kib")
            )
            parts.append(f"{name} request {ms:.0f} ms (server {wait:.0f} ms), {kib:,.0f} KiB")
        else:
            parts.append(f"no {name} request")
    return "; ".join(parts)


def main() -> None:
    parser = S.arguments(__doc__)
    parser.add_argument("--events", type=int, help="events in the long run (100000; 10000 with --quick)")
    parser.add_argument(
        "--loads", type=int, help="page loads of each session, alternately (3; 1 with --quick)"
    )
    args = parser.parse_args()
    n = args.events or (10_000 if args.quick else 100_000)
    loads = args.loads or (1 if args.quick else 3)
    from tests.support.browser import CHROMIUM, CHROMIUM_ARGS

    if not os.access(CHROMIUM, os.X_OK):
        raise SystemExit(f"transcript_page: needs chromium at {CHROMIUM}")
    bench = S.setup("sqlite", redis=False, name="page")
    from bench.replay import build_run

    S.log(f"transcript page: writing a {n}-event run and a 10-event one")
    owner, long_session, _ = build_run(n)
    _, short_session, _ = build_run(10)
    cookie = S.session_cookie(owner)
    daphne, port = S.start_daphne("hermesweb.asgi:application", bench.env, bench.data_dir / "logs")
    base_url = f"http://127.0.0.1:{port}"
    times: dict[str, list[dict[str, float]]] = {"long": [], "short": []}
    try:
        from playwright.sync_api import sync_playwright

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                load(browser, base_url, cookie, short_session)  # warm: imports, static files
                for i in range(loads):
                    for key, session_id in (("long", long_session), ("short", short_session)):
                        S.log(f"transcript page: load {i + 1} of the {key} session")
                        times[key].append(load(browser, base_url, cookie, session_id))
            finally:
                browser.close()
    finally:
        daphne.stop()

    def median(key: str, what: str) -> float:
        values = [t[what] for t in times[key]]
        return math.nan if any(math.isnan(v) for v in values) else S.percentile(values, 50)

    S.log(f"transcript page: {times}")
    rows = []
    for what, figure, target in (
        ("interactive", "time to interactive", TARGET_INTERACTIVE_MS),
        ("bottom", "time to the bottom, rendered", TARGET_BOTTOM_MS),
    ):
        rows.append(
            S.Row(
                bench="page",
                figure=f"{n // 1000}k-event run's session page: {figure} (median of {loads})",
                value=median("long", what),
                unit="ms",
                higher_is_better=False,
                baseline="10-event run",
                baseline_value=median("short", what),
                target=target,
                target_text=f"≤ {target / 1000:g} s",
                note=(
                    f"not reached within {TIMEOUT_MS / 1000:g} s in some load; "
                    if math.isnan(median("long", what))
                    else ""
                )
                + (
                    f"long tasks {median('long', 'long_total'):.0f} ms in all, the longest "
                    f"{median('long', 'long_max'):.0f} ms; {median('long', 'dom_nodes'):.0f} DOM nodes"
                    if what == "bottom"
                    else reads_note(times["long"])
                ),
            )
        )
    S.emit(rows, args.json)


if __name__ == "__main__":
    main()
