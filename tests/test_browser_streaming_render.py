"""A fast stream into an open page: markdown rendered in batches, and the page ends on the journal's text.

Issue 24 ("keep the page responsive while it streams"): events arrive far faster than frames
(here 1,500 uncoalesced token deltas in ~3 s, delivered in bursts by the embedded default's
database tail), and the page must render the streaming message at most once a frame, only its
last blocks (static/js/markdown.js `LiveMarkdown`), not once per delta. The live node counts
its renders in `data-live-renders`.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from runs import journal
from runs.journal import NewEvent, done_event
from runs.markdown import render_markdown
from runs.models import RunStatus
from runs.turns import finish_run
from tests import factories
from tests.support.browser import (  # noqa: F401 - fixtures
    Workbench,
    browser,
    fixture_lease,
    open_session,
    screenshots,
    wait_settled,
    workbench,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]

DELTAS = 1500
BURST = 25
# Markdown with every kind of block boundary the live renderer freezes at or must not:
# headings, paragraphs, a loose list across a blank line, a quote, a fence with a blank line in it.
BLOCKS = [
    "## Part {n}\n\n",
    "Some words about part {n}, with **bold** and `code` and a [link](https://example.org/{n}).\n\n",
    "- first point of {n}\n\n- second point, the list carries on\n\n",
    "> a quote in part {n}\n\n",
    "```python\ndef part_{n}():\n\n    return {n}\n```\n\n",
    "1. one\n2. two\n\n",
]
# The text as a reader sees it, in the page: the code blocks' copy bars are not the text.
SHOWN_TEXT = """([selector, html]) => {
  const strip = (root) => {
    const copy = root.cloneNode(true);
    for (const bar of copy.querySelectorAll('.code-bar')) bar.remove();
    return copy.textContent.replace(/\\s+/g, ' ').trim();
  };
  const node = document.querySelector(selector);
  const want = new DOMParser().parseFromString(`<div>${html}</div>`, 'text/html').body.firstChild;
  return node ? [strip(node), strip(want)] : null;
}"""


def stream_text() -> list[str]:
    """DELTAS pieces of a few characters each, cut anywhere (inside words, fences, markers)."""
    text = "".join(block.format(n=n) for n in range(60) for block in BLOCKS)
    size = -(-len(text) // DELTAS)
    return [text[i : i + size] for i in range(0, len(text), size)][:DELTAS]


def test_a_fast_stream_renders_in_batches_and_ends_on_the_journals_text(
    workbench: Workbench, user: Any
) -> None:
    project = factories.ProjectFactory(owner=user, name="Streams")
    session = factories.SessionFactory(project=project, title="Fast stream")
    run = factories.RunFactory(
        session=session,
        prompt_text="Stream fast",
        status=RunStatus.RUNNING,
        **fixture_lease(),
    )
    journal.append_batch(run.pk, [NewEvent("run.started", {"status": "running"})], publish=False)
    page = workbench.new_page()
    open_session(page, session.pk)
    pieces = stream_text()
    for start in range(0, len(pieces), BURST):
        events = [
            NewEvent("token.delta", {"message_id": "m1", "delta": d}) for d in pieces[start : start + BURST]
        ]
        journal.append_batch(run.pk, events, publish=False)
        time.sleep(0.05)  # paces the writer like a fast model; nothing waits on it
    text = "".join(pieces)
    live = "article.turn .md.live"
    expected = render_markdown(text)
    page.wait_for_function(
        f"(args) => {{ const r = ({SHOWN_TEXT})(args); return r && r[0] === r[1]; }}", arg=[live, expected]
    )
    renders = int(page.locator(live).get_attribute("data-live-renders") or "0")
    # At most a render a frame: far fewer than the deltas (per-delta rendering would be 1,500).
    assert 0 < renders <= DELTAS // 10, renders
    workbench.screenshot(page, "streaming-render-live")

    finish_run(run.pk, [done_event(RunStatus.COMPLETED, stop_reason="end_turn")])
    settled = wait_settled(page, 1)
    shown, want = page.evaluate(SHOWN_TEXT, [f"#{settled.get_attribute('id')} .md", expected])
    assert shown == want
    # Exactly the journal's text: the headings the stream was cut through are all there once.
    assert re.findall(r"Part \d+", shown) == [f"Part {n}" for n in range(60)]
