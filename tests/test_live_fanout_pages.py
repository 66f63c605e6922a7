"""Journal pages read for sockets are bounded in characters, not only in events.

The journal counts a page in events (HERMESWEB_EVENTS_PAGE_MAX, 5,000): a backlog of 5,000 tool
outputs of 64 KiB would be one read of ~320 MB per session. The feed's gap repair and a socket's
replay ask each page for as many events as the previous page says fit in protocol.PAGE_CHARS.
"""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync

from runs import journal
from runs.journal import NewEvent
from runs.live import feed as feed_module
from runs.live import reads
from runs.live import subscription as subscription_module
from runs.live.feed import EventsItem, Item, SessionFeed
from runs.live.protocol import PAGE_CHARS
from runs.live.subscription import Subscription
from runs.models import RunStatus
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)

EVENTS = 80
OUTPUT_CHARS = 64 * 1024  # a large tool output


class PageSizes:
    """reads.read_page, recording each page's characters of envelopes."""

    def __init__(self) -> None:
        self.pages: list[int] = []

    def __call__(self, run_id: int, after: int, upto: int | None = None) -> Any:
        page = reads.read_page(run_id, after, upto)
        self.pages.append(sum(len(text) for _, _, text in page.rows))
        return page


def large_outputs_run() -> Any:
    run = factories.RunFactory(status=RunStatus.RUNNING)
    outputs = [
        NewEvent("tool_call.update", {"tool_call_id": f"t{n}", "output": f"{n:08d}" * (OUTPUT_CHARS // 8)})
        for n in range(EVENTS)
    ]
    journal.append_batch(run.pk, outputs, publish=False)
    return run


def assert_bounded(pages: list[int]) -> None:
    envelope = OUTPUT_CHARS + 1024  # one event's envelope, at most
    assert sum(pages) >= EVENTS * OUTPUT_CHARS, "not everything was read"
    assert len(pages) > 1 and max(pages) <= PAGE_CHARS + envelope, f"pages of {pages} characters"


class Taker:
    """A feed's subscriber that takes every batch at once."""

    def __init__(self) -> None:
        self.seqs: list[int] = []

    async def offer(self, item: EventsItem) -> bool:
        self.seqs += [frame.seq for frame in item.frames]
        return True

    def push(self, item: Item) -> None:
        raise AssertionError(f"nothing is pushed here: {item!r}")


def test_the_feed_reads_a_backlog_of_large_outputs_in_pages_bounded_in_characters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = large_outputs_run()
    sizes = PageSizes()
    monkeypatch.setattr(feed_module, "read_page", sizes)
    socket = Taker()
    feed = SessionFeed(run.session_id)
    feed.heads, feed.floor = {run.pk: 0}, run.pk - 1
    feed.subscribers.add(socket)

    # A notification that carries no events (a large batch): the feed reads the whole range.
    async_to_sync(feed.on_message)({"type": "run.events", "run_id": run.pk, "last_seq": EVENTS})

    assert socket.seqs == list(range(1, EVENTS + 1))
    assert_bounded(sizes.pages)


def test_a_replay_of_large_outputs_reads_pages_bounded_in_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    run = large_outputs_run()
    sizes = PageSizes()
    monkeypatch.setattr(subscription_module, "read_page", sizes)
    sent: list[str] = []

    async def send(frame: str) -> None:
        sent.append(frame)

    replay = Subscription(run.session_id, {run.pk: 0}, send)
    replay.followed.add(run.pk)
    replay.sent[run.pk] = 0
    async_to_sync(replay.catch_up)(run.pk)

    assert replay.sent[run.pk] == EVENTS
    assert_bounded(sizes.pages)
