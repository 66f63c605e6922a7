"""Subscribe frames are rate-limited per socket (issue 22, item 5): a burst past the limit gets
`rate_limited` error frames, no work, and the socket stays open and subscribed."""

from __future__ import annotations

import pytest

from runs.live.consumer import SUBSCRIBE_BURST
from tests import factories
from tests.support.live import LiveStack, layer, live, session_cookie  # noqa: F401
from tests.support.runs import run_of, submit

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_burst_of_subscribes_is_refused_past_the_limit_and_the_socket_stays_usable(live: LiveStack) -> None:
    live.start_daphne()
    session = factories.SessionFactory(project=factories.ProjectFactory(agent="demo"))
    socket = live.socket(session.pk, session_cookie(session.project.owner))
    burst = 200
    for _ in range(burst):
        socket.subscribe()
    socket.send(type="ping")
    frames = socket.until(lambda f: f["type"] == "pong")
    refused = [f for f in frames if f["type"] == "error"]
    assert {f["code"] for f in refused} == {"rate_limited"}, refused
    assert all(f["retry_after"] > 0 for f in refused)
    # At most the burst (and what refilled meanwhile) was served; the rest was refused.
    assert burst - SUBSCRIBE_BURST - 5 <= len(refused) < burst, len(refused)
    # Still subscribed: a turn started now streams to this socket.
    live.start_runner()
    run_id = run_of(submit(session, "fast")).pk
    socket.events_to_terminal(run_id)
    print(f"FIGURE rate_limit: {burst} subscribes in a burst, {len(refused)} refused with rate_limited")
