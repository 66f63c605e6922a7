"""A browser offline during a streaming run (issue 23): back online, the page shows exactly the journal.

The run is held open by the test itself: it is the run's writer (journal.append_batch, as the
runner's writer appends) and ends it when it chooses, so nothing races a clock. While the
browser is offline (Playwright's `context.set_offline`) the run goes on streaming, the user
types into the composer and sends a message (it fails and waits in the outbox). Back online,
the turn's text is exactly the journal's deltas in order — nothing missing, nothing twice — the
draft is still in the composer, and the message sent offline is queued exactly once.

HERMESWEB_OFFLINE_SECONDS sets how long the browser stays offline (default 12 s for CI; the
issue's minute is `HERMESWEB_OFFLINE_SECONDS=60`). Twelve seconds is enough to prove the same
thing: socket.js's backoff (0.5, 1, 2, 4, 8 s, ±25 %) fails four to five reconnects in it, the
page's HTTP fallback fails too, and the run appends a batch every 0.25 s throughout, so the page
must resume from its cursor across several failed attempts and dozens of server-side batches.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from intents.models import PendingIntent
from runs import journal
from runs.journal import NewEvent, done_event
from runs.models import JournalEvent, RunStatus
from runs.turns import finish_run
from tests import factories
from tests.support.browser import (  # noqa: F401 - fixtures
    Workbench,
    browser,
    open_session,
    screenshots,
    workbench,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser, pytest.mark.timeout(240)]

OFFLINE_SECONDS = float(os.environ.get("HERMESWEB_OFFLINE_SECONDS", "12"))
BATCH_EVERY = 0.25  # the run streams a batch this often, online and offline
DRAFT = "A draft typed while offline: it must still be here."
QUEUED = "Sent while offline, queued once back online."


def word(n: int) -> str:
    return f"w{n:05d} "


def held_run(session: Any) -> Any:
    """A running turn whose lease a live runner row holds, so no reaper interrupts it."""
    holder = factories.RunnerFactory(host="elsewhere")
    run = factories.RunFactory(
        session=session,
        prompt_text="Stream until the test says stop",
        status=RunStatus.RUNNING,
        lease_owner=holder.id,
        lease_expires_at=timezone.now() + timedelta(hours=1),
    )
    journal.append_batch(run.pk, [NewEvent("run.started", {"status": "running"})])
    return run


class Stream:
    """The run's writer: appends numbered words, a few per batch."""

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id
        self.words = 0

    def batch(self, count: int = 3) -> None:
        events = [
            NewEvent("token.delta", {"message_id": "m1", "delta": word(self.words + i)}) for i in range(count)
        ]
        journal.append_batch(self.run_id, events)
        self.words += count

    def text(self) -> str:
        return "".join(word(n) for n in range(self.words)).strip()


def test_a_browser_offline_mid_run_shows_exactly_the_journal_and_keeps_its_draft_and_queue(
    workbench: Workbench, user: Any
) -> None:
    session = factories.SessionFactory(project=factories.ProjectFactory(owner=user), title="Offline")
    run = held_run(session)
    stream = Stream(run.pk)
    stream.batch()
    page = workbench.new_page()
    open_session(page, session.pk)
    page.wait_for_function("(w) => document.body.innerText.includes(w)", arg=word(stream.words - 1).strip())

    page.context.set_offline(True)
    page.wait_for_selector(".connection:not([data-state='live'])")
    page.locator(".composer textarea").fill(QUEUED)
    page.locator(".composer textarea").press("Enter")
    page.wait_for_selector("[data-client-id] >> text=Not sent")
    page.locator(".composer textarea").fill(DRAFT)
    offline_from = time.monotonic()
    offline_batches = 0
    while time.monotonic() - offline_from < OFFLINE_SECONDS:
        stream.batch()
        offline_batches += 1
        time.sleep(BATCH_EVERY)  # the run's own pace: the stream the page must catch up on
    state = page.evaluate("() => document.body.dataset.connection")
    page.context.set_offline(False)

    page.wait_for_selector(".connection[data-state='live']")
    stream.batch()  # one more live after the reconnect
    last = word(stream.words - 1).strip()
    page.wait_for_function("(w) => document.body.innerText.includes(w)", arg=last)

    # The message sent offline went out once back online: queued behind the run, once.
    page.wait_for_selector(f".intent-card[data-kind='queue'] >> text={QUEUED}")
    assert PendingIntent.objects.filter(session=session, text=QUEUED).count() == 1
    assert page.locator(".composer textarea").input_value() == DRAFT

    finish_run(run.pk, [done_event(RunStatus.COMPLETED, stop_reason="end_turn")])
    held = page.locator(f"#run-{run.pk}")
    page.wait_for_selector(f"#run-{run.pk}[data-status='completed'][data-rendered='true']")

    # Exactly the journal: every word once, in order.
    deltas = list(
        JournalEvent.objects.filter(run=run, type="token.delta")
        .order_by("seq")
        .values_list("payload", flat=True)
    )
    expected = " ".join("".join(d["delta"] for d in deltas).split())
    shown = " ".join(held.inner_text().split())
    assert expected in shown, f"page shows {shown[:300]!r}…, journal {expected[:300]!r}…"
    twice = [n for n in range(stream.words) if shown.count(word(n).strip()) != 1]
    assert not twice, f"words shown other than once: {twice[:20]}"
    assert page.locator(".composer textarea").input_value() == DRAFT
    # The page's socket really went down with the network and came back (a new one, resumed).
    assert workbench.daphne is not None
    sockets = workbench.daphne.log().count('"WSCONNECT /ws/sessions/')
    assert sockets >= 2, workbench.daphne.log()[-3000:]
    print(
        f"FIGURE browser offline: {OFFLINE_SECONDS:g} s offline (connection {state!r}), "
        f"{offline_batches} batches ({3 * offline_batches} events) appended meanwhile; "
        f"{len(deltas)} deltas checked, lost 0, duplicated 0; {sockets} sockets; draft kept, "
        "1 message queued once"
    )
