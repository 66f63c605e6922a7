"""A feed that fell behind sends what queued up as one batch per socket (runs.live.feed,
merged_notifications): a send costs the web far more than an event in it (bench/README.md,
round eleven)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from asgiref.sync import async_to_sync

from runs.live.feed import EventsItem, Item, SessionFeed, merged_notifications

RUN, SESSION = 7, 3


class Collector:
    """A subscriber that takes every batch at once, keeping what it would put on the wire."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.wire: list[str] = []

    async def offer(self, item: EventsItem) -> bool:
        self.batches.append([frame.seq for frame in item.frames])
        self.wire += [frame.text for frame in item.wire]
        return True

    def push(self, item: Item) -> None:
        raise AssertionError(f"nothing should be queued: {item!r}")


def notification(seqs: list[int], run_id: int = RUN, inline: bool = True) -> dict[str, Any]:
    message: dict[str, Any] = {
        "type": "run.events",
        "session_id": SESSION,
        "run_id": run_id,
        "last_seq": seqs[-1],
    }
    if inline:
        message["events"] = [
            {"run_id": run_id, "session_id": SESSION, "seq": s, "type": "token.delta", "terminal": False}
            for s in seqs
        ]
    return message


def test_notifications_queued_while_the_feed_was_busy_reach_each_socket_as_one_frame() -> None:
    sockets = Collector(), Collector()

    async def scenario() -> None:
        feed = SessionFeed(SESSION)
        feed.heads, feed.floor = {RUN: 0}, RUN - 1
        feed.subscribers.update(sockets)
        for seqs in ([1, 2], [3], [4, 5, 6]):  # rung while the feed was busy elsewhere
            feed.post(notification(seqs))
        task = asyncio.ensure_future(feed._inbox_loop())
        while not sockets[0].batches:
            await asyncio.sleep(0)
        task.cancel()

    async_to_sync(scenario)()
    for socket in sockets:
        assert socket.batches == [[1, 2, 3, 4, 5, 6]]
        [frame] = socket.wire
        message = orjson.loads(frame)
        assert message["type"] == "events"
        assert [event["seq"] for event in message["events"]] == [1, 2, 3, 4, 5, 6]


def test_only_notifications_of_one_run_that_follow_on_are_merged() -> None:
    messages = [
        notification([1, 2]),
        notification([3]),
        notification([1], run_id=RUN + 1),  # another run: kept apart, in its place
        notification([4]),
        notification([6]),  # a gap: left for the feed to read from the database
        notification([7, 8], inline=False),  # too many to carry: left alone
        {"type": "session.changed"},
    ]

    merged = merged_notifications(messages)

    seqs = [[e["seq"] for e in m.get("events") or []] for m in merged]
    assert seqs == [[1, 2, 3], [1], [4], [6], [], []]
    assert [m.get("last_seq") for m in merged] == [3, 1, 4, 6, 8, None]
    assert merged[0]["run_id"] == RUN and merged[1]["run_id"] == RUN + 1
