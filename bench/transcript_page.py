"""A long session in the browser: the session page of a finished 100k-event run, in chromium.

The run is bench/replay.py's (`build_run`: token deltas, a tool update every 20th event, written
through the journal) on the embedded default (SQLite, no Redis), served by a real daphne.
Playwright drives Debian's chromium (/usr/bin/chromium, headless); each load is a fresh
browser context, timed from navigation start (the page's `performance.now()`):
- interactive: the workbench says it is ready (`#workbench[data-ready=true]`: transcript
  loaded, socket started, composer usable) — read in the page, so it is also when the main
  thread was free to answer;
- bottom: the run is all there and settled (its turn `completed`: a turn larger than a
  transcript page comes cut and the socket brings the rest), its markdown in place
  (`data-rendered` true, or `plain` for a turn too large for the server to render: the browser
  renders its text as it comes into view), and the transcript scrolled to its end.
Long tasks (PerformanceObserver) are summed beside them. The baseline is the same page for a
session whose one run has 10 events, loaded alternately with the long one.

Then, streaming (issue 24, "responsive while it streams"): a run streams into the open page at
`--rate` token deltas a second for `--seconds`, coalesced and appended as the runner's writer
does (one row per HERMESWEB_COALESCE_MS window, one message), into a message that already holds
`--prefill` characters of markdown (a long answer going on). Meanwhile a key is typed into the
composer every 100 ms. Measured: long tasks while it streams (count, worst), input latency (a
keydown's timestamp to the next animation frame, p50/p99/max), how far the page lags the
journal at the end, and that the page ends showing exactly the journal's text (live, and once
settled). The baseline is the same typing on the same page with nothing streaming.

usage: python bench/transcript_page.py [--events 100000] [--loads 3] [--rate 1000] [--seconds 10]
                                       [--prefill 400000] [--quick] [--json FILE]
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson

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
// The socket's frames: when the first and the latest came (the replay of a cut turn's rest).
window.__ws = { open: null, first: null, last: null, frames: 0 };
window.WebSocket = class extends window.WebSocket {
  constructor(...args) {
    super(...args);
    this.addEventListener('open', () => (window.__ws.open ??= performance.now()));
    this.addEventListener('message', () => {
      const now = performance.now();
      window.__ws.first ??= now;
      window.__ws.last = now;
      window.__ws.frames += 1;
    });
  }
};
"""
RESOURCES = r"""() => {
  const out = {};
  for (const e of performance.getEntriesByType('resource')) {
    // By path: the `transcript.js` module is no transcript read.
    const path = new URL(e.name).pathname;
    const name = /^\/api\/sessions\/\d+\/transcript$/.test(path) ? 'transcript'
      : /^\/sessions\/\d+\/(runs\/\d+\/)?fragment$/.test(path) ? 'fragments' : null;
    // The first read is the one the page waits on; the rest (the merge when the socket is live)
    // are counted with their bytes.
    if (name && !out[name]) out[name] = {
      ms: e.responseEnd - e.startTime, wait: e.responseStart - e.requestStart, kib: e.transferSize / 1024,
      count: 0, all_kib: 0,
    };
    if (name) { out[name].count += 1; out[name].all_kib += e.transferSize / 1024; }
  }
  return out;
}"""
READY = "() => document.querySelector('#workbench[data-ready=\"true\"]') ? performance.now() : false"
BOTTOM = """() => {
  const el = document.querySelector('[data-role=scroller]');
  const turn = [...document.querySelectorAll('article.turn')].pop();
  const done = turn && turn.dataset.status === 'completed'
    && ['true', 'plain'].includes(turn.dataset.rendered);
  return done && el && el.scrollHeight - el.scrollTop - el.clientHeight < 24 ? performance.now() : false;
}"""

# ---------------------------------------------------------------- streaming

# In the page: every keydown's latency to the next frame, and the long tasks of a window.
TYPING = """
window.__keys = [];
document.addEventListener('keydown', (event) => {
  const at = event.timeStamp;
  requestAnimationFrame(() => window.__keys.push(performance.now() - at));
}, true);
"""
# The text a reader sees in a node (code blocks' copy bars are not text) and in the server's HTML.
SHOWN = """([selector, html]) => {
  const strip = (root) => {
    const copy = root.cloneNode(true);
    for (const bar of copy.querySelectorAll('.code-bar')) bar.remove();
    return copy.textContent.replace(/\\s+/g, ' ').trim();
  };
  const node = document.querySelector(selector);
  const want = new DOMParser().parseFromString(`<div>${html}</div>`, 'text/html').body.firstChild;
  return node ? [strip(node), strip(want)] : null;
}"""
SAME = f"(args) => {{ const r = ({SHOWN})(args); return !!r && r[0] === r[1]; }}"
MARKDOWN = [
    "## Step {n}\n\n",
    "Reading `module_{n}.py` first: the fixture builds the session before the project, so the "
    "**owner** check runs on an empty [queryset](https://example.org/{n}) and passes.\n\n",
    "- the first thing to check in step {n}\n- the second, with `a_call({n})`\n\n",
    "> A note on step {n}: nothing here changes the journal.\n\n",
    "```python\ndef step_{n}(session):\n    return session.project_id == {n}\n```\n\n",
    "| case | result |\n|---|---|\n| {n} | ok |\n\n",
]


def markdown_text(chars: int, start: int = 0) -> str:
    parts: list[str] = []
    size, n = 0, start
    while size < chars:
        for block in MARKDOWN:
            parts.append(block.format(n=n))
            size += len(parts[-1])
        n += 1
    return "".join(parts)


def tokens(text: str) -> list[str]:
    """The text as an LLM streams it: a word (and its space) or a few characters at a time."""
    return [piece for piece in re.findall(r"\S{1,6}\s*|\s+", text) if piece]


def stream_writer(run_id: int, pieces: list[str], rate: float, window: float, out: dict[str, float]) -> None:
    """Append `pieces` at `rate` a second, one row per `window` (the writer's coalescing), from a thread."""
    from django.db import connection

    from runs import journal
    from runs.journal import NewEvent

    per_window = max(1, round(rate * window))
    start = time.monotonic()
    rows = 0
    try:
        for index in range(0, len(pieces), per_window):
            delay = start + (index / rate) - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # the model's pace
            delta = "".join(pieces[index : index + per_window])
            journal.append_batch(
                run_id, [NewEvent("token.delta", {"message_id": "m1", "delta": delta})], publish=False
            )
            rows += 1
    finally:
        out.update(rows=float(rows), seconds=time.monotonic() - start)
        connection.close()


def streaming(browser: Any, base_url: str, cookie: str, owner: Any, args: Any) -> dict[str, Any]:
    """One page open on a session while a run streams into it; see the module's docstring."""
    from django.conf import settings

    from runs import journal
    from runs.journal import NewEvent, done_event
    from runs.markdown import render_markdown
    from runs.models import RunStatus
    from runs.turns import finish_run

    # Playwright's sync API runs an event loop in this thread; these ORM calls are plain blocking
    # calls between browser steps all the same (as in tests/support/browser.py). Children started
    # before this keep their own environment.
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    session = S.make_session(owner, project_name="stream")
    run = S.running_run(session)
    prefill = markdown_text(args.prefill) if args.prefill else ""
    events = [NewEvent("run.started", {"status": "running"})]
    events += [NewEvent("token.delta", {"message_id": "m1", "delta": prefill})] if prefill else []
    journal.append_batch(run.pk, events, publish=False)
    pieces = tokens(markdown_text(int(args.rate * args.seconds * 6), start=10_000))[
        : int(args.rate * args.seconds)
    ]
    context = browser.new_context(base_url=base_url, viewport={"width": 1280, "height": 860})
    result: dict[str, Any] = {}
    try:
        context.add_cookies([{"name": "sessionid", "value": cookie, "url": base_url}])
        context.add_init_script(LONG_TASKS + TYPING)
        page = context.new_page()
        page.goto(f"/sessions/{session.pk}/", timeout=TIMEOUT_MS)
        page.wait_for_selector("#workbench[data-ready='true']", timeout=TIMEOUT_MS)
        page.wait_for_selector(".connection[data-state='live']", timeout=TIMEOUT_MS)
        box = page.locator(".composer textarea")
        box.focus()

        def typing(seconds: float) -> dict[str, float]:
            page.evaluate(
                "() => { window.__keys = []; window.__long = []; window.__from = performance.now(); }"
            )
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                page.keyboard.press("a")
                page.wait_for_timeout(100)
            keys = page.evaluate("window.__keys")
            tasks = page.evaluate("() => window.__long")
            box.fill("")
            return {
                "keys": float(len(keys)),
                "key_p50": S.percentile(keys, 50),
                "key_p99": S.percentile(keys, 99),
                "key_max": max(keys, default=math.nan),
                "long_count": float(len(tasks)),
                "long_max": max(tasks, default=0.0),
                "long_total": float(sum(tasks)),
            }

        result["idle"] = typing(min(args.seconds, 3.0))
        cdp = context.new_cdp_session(page) if args.profile else None
        if cdp is not None:
            cdp.send("Profiler.enable")
            cdp.send("Profiler.start")
        written: dict[str, float] = {}
        window = settings.HERMESWEB_COALESCE_MS / 1000.0
        writer = threading.Thread(target=stream_writer, args=(run.pk, pieces, args.rate, window, written))
        writer.start()
        result["streaming"] = typing(args.seconds)
        writer.join()
        if cdp is not None:
            profile = cdp.send("Profiler.stop")["profile"]
            Path(args.profile).write_bytes(orjson.dumps(profile))
            S.log(
                "transcript page: the page's main thread while it streamed, self time:\n"
                + top_functions(profile)
            )
        text = prefill + "".join(pieces)
        expected = render_markdown(text)
        live = "article.turn .md.live"
        wrote_at = time.monotonic()
        page.wait_for_function(SAME, arg=[live, expected], timeout=TIMEOUT_MS, polling=50)
        result["lag_ms"] = 1000 * (time.monotonic() - wrote_at)
        result["live_same"] = True
        result["renders"] = float(page.locator(live).get_attribute("data-live-renders") or "nan")
        result["rows"] = written.get("rows", math.nan)
        result["deltas"] = float(len(pieces))
        result["rate"] = len(pieces) / written.get("seconds", math.nan)
        if args.screenshots:
            for name, scheme, size in SHOTS:
                shot(context, page, args.screenshots, f"streaming-{name}", scheme, size)
        # From a thread: its publish-on-commit needs one without Playwright's event loop.
        ender = threading.Thread(
            target=finish_run, args=(run.pk, [done_event(RunStatus.COMPLETED, stop_reason="end_turn")])
        )
        ender.start()
        ender.join()
        page.wait_for_selector("article.turn[data-rendered='true']", timeout=TIMEOUT_MS)
        settled = page.evaluate(SHOWN, ["article.turn .md", expected])
        result["settled_same"] = bool(settled and settled[0] == settled[1])
        if args.screenshots:
            for name, scheme, size in SHOTS:
                shot(context, page, args.screenshots, f"settled-{name}", scheme, size)
    finally:
        context.close()
    return result


def top_functions(profile: dict[str, Any], count: int = 15) -> str:
    """A CPU profile's functions by self time (ms), for the log."""
    nodes = {node["id"]: node["callFrame"] for node in profile["nodes"]}
    spent: dict[str, float] = {}
    for sample, delta in zip(profile["samples"], profile["timeDeltas"], strict=False):
        frame = nodes[sample]
        name, url = frame["functionName"] or "(anonymous)", frame["url"].rsplit("/", 1)[-1]
        where = f"{name} {url}:{frame['lineNumber'] + 1}"
        spent[where] = spent.get(where, 0.0) + delta / 1000
    return "\n".join(
        f"{ms:9.1f} ms  {where}" for where, ms in sorted(spent.items(), key=lambda kv: -kv[1])[:count]
    )


SHOTS = (("light", "light", (1280, 860)), ("dark", "dark", (1280, 860)), ("phone", "light", (420, 860)))


def shot(context: Any, page: Any, directory: str, name: str, scheme: str, size: tuple[int, int]) -> None:
    """The page as it is, in `scheme`; at a phone's width in a page of its own, opened at that width."""
    if size[0] >= 1000:
        page.emulate_media(color_scheme=scheme)
        page.screenshot(path=str(Path(directory) / f"{name}.png"))
        page.emulate_media(color_scheme="light")
        return
    phone = context.new_page()
    try:
        phone.set_viewport_size({"width": size[0], "height": size[1]})
        phone.goto(page.url, timeout=TIMEOUT_MS)
        phone.wait_for_selector("#workbench[data-ready='true']", timeout=TIMEOUT_MS)
        phone.wait_for_selector(".connection[data-state='live']", timeout=TIMEOUT_MS)
        phone.screenshot(path=str(Path(directory) / f"{name}.png"))
    finally:
        phone.close()


def load(
    browser: Any, base_url: str, cookie: str, session_id: int, profile: str | None = None
) -> dict[str, float]:
    """One load of a session's page, timed; `profile`: save the page's CPU profile there too."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    context = browser.new_context(base_url=base_url, viewport={"width": 1280, "height": 860})
    try:
        context.add_cookies([{"name": "sessionid", "value": cookie, "url": base_url}])
        context.add_init_script(LONG_TASKS)
        page = context.new_page()
        cdp = context.new_cdp_session(page) if profile else None
        if cdp is not None:
            cdp.send("Profiler.enable")
            cdp.send("Profiler.setSamplingInterval", {"interval": 200})
            cdp.send("Profiler.start")
        page.goto(f"/sessions/{session_id}/", wait_until="commit", timeout=TIMEOUT_MS)
        ready = bottom = math.nan  # not there within TIMEOUT_MS: a MISS, with what it waited on
        with contextlib.suppress(PlaywrightTimeout):
            ready = page.wait_for_function(READY, timeout=TIMEOUT_MS, polling=10).json_value()
            bottom = page.wait_for_function(BOTTOM, timeout=TIMEOUT_MS, polling=10).json_value()
        socket = page.evaluate("() => window.__ws")
        if cdp is not None:
            cpu = cdp.send("Profiler.stop")["profile"]
            Path(str(profile)).write_bytes(orjson.dumps(cpu))
            S.log("transcript page: the long page's main thread, self time:\n" + top_functions(cpu, 25))
        tasks = page.evaluate("() => window.__long")
        # Where the time went: the two reads the page waits on (the transcript, the rendered turns).
        reads = page.evaluate(RESOURCES)
        return {
            "interactive": float(ready),
            "bottom": float(bottom),
            "long_total": float(sum(tasks)),
            "long_max": float(max(tasks, default=0.0)),
            "dom_nodes": float(page.evaluate("() => document.getElementsByTagName('*').length")),
            **{f"socket_{key}": math.nan if value is None else float(value) for key, value in socket.items()},
            **{
                f"{name}_{key}": float(value) for name, entry in reads.items() for key, value in entry.items()
            },
        }
    finally:
        context.close()


def reads_note(loads: list[dict[str, float]]) -> str:
    """The transcript's and the fragments' first requests: total ms, of which the server's wait, and
    size; then how many there were and their bytes in all."""
    parts = []
    for name in ("transcript", "fragments"):
        if f"{name}_ms" in loads[0]:
            ms, wait, kib, count, all_kib = (
                S.percentile([t.get(f"{name}_{k}", 0.0) for t in loads], 50)
                for k in ("ms", "wait", "kib", "count", "all_kib")
            )
            parts.append(
                f"{name} request {ms:.0f} ms (server {wait:.0f} ms), {kib:,.0f} KiB"
                f" (requests {count:.0f}, {all_kib:,.0f} KiB in all)"
            )
        else:
            parts.append(f"no {name} request")
    return "; ".join(parts)


def main() -> None:
    parser = S.arguments(__doc__)
    parser.add_argument("--events", type=int, help="events in the long run (100000; 10000 with --quick)")
    parser.add_argument(
        "--loads", type=int, help="page loads of each session, alternately (3; 1 with --quick)"
    )
    parser.add_argument(
        "--rate", type=float, default=1000.0, help="token deltas a second while streaming (1000)"
    )
    parser.add_argument("--seconds", type=float, help="how long it streams (10; 4 with --quick)")
    parser.add_argument(
        "--prefill", type=int, default=400_000, help="characters already in the streaming message (400000)"
    )
    parser.add_argument(
        "--screenshots", help="a directory for screenshots of the streaming page (light, dark, phone)"
    )
    parser.add_argument("--profile", help="save a CPU profile of the page while it streams (.cpuprofile)")
    parser.add_argument("--stream-only", action="store_true", help="only the streaming phase")
    parser.add_argument(
        "--page-profile", help="save a CPU profile of the long page's first load (.cpuprofile)"
    )
    args = parser.parse_args()
    n = args.events or (10_000 if args.quick else 100_000)
    loads = args.loads or (1 if args.quick else 3)
    args.seconds = args.seconds or (4.0 if args.quick else 10.0)
    from tests.support.browser import CHROMIUM, CHROMIUM_ARGS

    if not os.access(CHROMIUM, os.X_OK):
        raise SystemExit(f"transcript_page: needs chromium at {CHROMIUM}")
    bench = S.setup("sqlite", redis=False, name="page")
    from bench.replay import build_run

    S.log(f"transcript page: writing a {n}-event run and a 10-event one")
    owner, long_session, _ = build_run(10 if args.stream_only else n)
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
                for i in range(0 if args.stream_only else loads):
                    for key, session_id in (("long", long_session), ("short", short_session)):
                        S.log(f"transcript page: load {i + 1} of the {key} session")
                        profile = args.page_profile if key == "long" and i == 0 else None
                        times[key].append(load(browser, base_url, cookie, session_id, profile))
                S.log(f"transcript page: streaming {args.rate:g} deltas/s for {args.seconds:g} s")
                stream = streaming(browser, base_url, cookie, owner, args)
            finally:
                browser.close()
    finally:
        daphne.stop()

    S.log(f"transcript page: {times}")
    S.log(f"transcript page, streaming: {stream}")
    rows = [] if args.stream_only else page_rows(n, loads, times)
    rows += stream_rows(stream, args)
    S.emit(rows, args.json)


def stream_rows(stream: dict[str, Any], args: Any) -> list[S.Row]:
    busy, idle = stream["streaming"], stream["idle"]
    what = f"streaming {stream['rate']:,.0f} deltas/s, {args.seconds:g} s, into {args.prefill:,} chars"
    exact = "yes" if stream.get("live_same") and stream.get("settled_same") else "NO"
    note = (
        f"{stream['deltas']:,.0f} deltas in {stream['rows']:,.0f} rows, "
        f"{stream['renders']:,.0f} live renders; "
        f"page caught up {stream['lag_ms']:,.0f} ms after the last write; shows the journal's text exactly "
        f"(live and settled): {exact}"
    )
    return [
        S.Row(
            bench="page",
            figure=f"{what}: input latency p99, keydown → next frame ({busy['keys']:.0f} keys)",
            value=busy["key_p99"],
            unit="ms",
            higher_is_better=False,
            baseline="nothing streaming",
            baseline_value=idle["key_p99"],
            note=f"p50 {busy['key_p50']:.0f} ms, max {busy['key_max']:.0f} ms "
            f"(idle: p50 {idle['key_p50']:.0f}); {note}",
        ),
        S.Row(
            bench="page",
            figure=f"{what}: the longest task",
            value=busy["long_max"],
            unit="ms",
            higher_is_better=False,
            baseline="nothing streaming",
            baseline_value=idle["long_max"],
            note=f"{busy['long_count']:.0f} long tasks, {busy['long_total']:.0f} ms in all "
            f"(idle: {idle['long_count']:.0f}, {idle['long_total']:.0f} ms)",
        ),
    ]


def page_rows(n: int, loads: int, times: dict[str, list[dict[str, float]]]) -> list[S.Row]:
    def median(key: str, what: str) -> float:
        values = [t[what] for t in times[key]]
        return math.nan if any(math.isnan(v) for v in values) else S.percentile(values, 50)

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
                    f"{median('long', 'long_max'):.0f} ms; {median('long', 'dom_nodes'):.0f} DOM nodes; "
                    f"socket open at {median('long', 'socket_open'):.0f} ms, its frames "
                    f"{median('long', 'socket_first'):.0f} → {median('long', 'socket_last'):.0f} ms"
                    if what == "bottom"
                    else reads_note(times["long"])
                ),
            )
        )
    return rows


if __name__ == "__main__":
    main()
