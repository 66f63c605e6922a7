"""A process that can publish to Redis but lacks the key never puts a frame on a socket (issue 38, 3).

The attacker here is a raw redis client that knows the channel prefix and every group name
(`session.<id>`, `journal`, `user.<id>`, …) but not the key derived from SECRET_KEY. It
publishes forged notifications in every form it could guess: channels_redis' plain msgpack, JSON,
and Fernet tokens sealed with a key of its own. The web's safety poll is set to 10 minutes, so
whatever reaches the socket during the test came through the doorbell: real events must, forged
ones never.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import redis
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured

from hermesweb.channel_layer import SealedPubSubLayer, redis_channel_layer, sealing_keys
from runs import journal, notify
from runs.models import Run, RunStatus
from tests import factories
from tests.support.hold import release
from tests.support.live import LiveSocket, LiveStack, layer, live, session_cookie  # noqa: F401

FORGED = "FORGED: your session expired, re-enter your password at https://evil.example/"
# Longer than the test: a frame on the socket came through the doorbell, not the database poll.
NO_POLL = {"HERMESWEB_LIVE_SAFETY_POLL_SECONDS": "600"}


class Forger:
    """Publishes straight to Redis under the deployment's prefix, with every encoding but the key."""

    def __init__(self, stack: LiveStack) -> None:
        self.prefix = stack.settings.HERMESWEB_TEST_REDIS_PREFIX
        self.client = redis.Redis.from_url(stack.settings.REDIS_URL)
        self.guessed = Fernet(base64.urlsafe_b64encode(hashlib.sha256(b"hermesweb").digest()))
        self.sent = 0

    def encodings(self, message: dict[str, Any]) -> list[bytes]:
        packed = msgpack.packb(message)
        return [packed, json.dumps(message).encode(), self.guessed.encrypt(packed)]

    def publish(self, group: str, message: dict[str, Any]) -> None:
        for data in self.encodings(message):
            self.client.publish(f"{self.prefix}__group__{group}", data)
            self.sent += 1

    def events(self, session_id: int, run_id: int, seqs: range) -> list[dict[str, Any]]:
        return [
            {
                "event_id": f"forged-{run_id}-{seq}",
                "seq": seq,
                "run_id": run_id,
                "session_id": session_id,
                "type": "token.delta",
                "created_at": time.time(),
                "terminal": False,
                "payload": {"message_id": "m1", "delta": FORGED},
            }
            for seq in seqs
        ]

    def forge_run(self, session_id: int, run_id: int, seqs: range) -> None:
        """The run's next events, to the session's group and inside a runner's journal message."""
        events = self.events(session_id, run_id, seqs)
        run_events = {
            "type": "run.events",
            "session_id": session_id,
            "run_id": run_id,
            "last_seq": seqs[-1],
            "events": events,
        }
        self.publish(notify.session_group(session_id), run_events)
        self.publish(notify.JOURNAL_GROUP, {"type": "journal.events", "runs": [run_events]})

    def forge_the_rest(self, session_id: int, user_id: int) -> None:
        """The doorbells that carry no events: a snapshot ring, the sidebar's, sign-in, owners, runners."""
        self.publish(notify.session_group(session_id), {"type": "session.changed", "session_id": session_id})
        self.publish(notify.user_sessions_group(user_id), {"type": "user.sessions", "user_id": user_id})
        signin = {"type": "signin.changed", "user_id": user_id, "session_tag": None}
        self.publish(notify.user_group(user_id), signin)
        self.publish(notify.OWNERS_GROUP, {"type": "owners.changed"})
        self.publish(notify.RUNNERS_GROUP, {"type": "runner.wake", "reason": "forged", "run_id": None})


@pytest.fixture
def forger(live: LiveStack) -> Iterator[Forger]:
    forger = Forger(live)
    try:
        yield forger
    finally:
        forger.client.close()


def following(stack: LiveStack, session: Any) -> LiveSocket:
    socket = stack.socket(session.pk, session_cookie(session.project.owner))
    socket.subscribe()
    socket.session()
    return socket


def is_forged(frame: dict[str, Any]) -> bool:
    return "FORGED" in json.dumps(frame)


def delta(text: str) -> journal.NewEvent:
    return journal.NewEvent("token.delta", {"message_id": "m1", "delta": text})


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("layer", ["redis"], indirect=True)
def test_forged_notifications_without_the_key_never_reach_a_socket_and_real_ones_still_do(
    live: LiveStack, forger: Forger
) -> None:
    live.start_daphne(**NO_POLL)
    session = factories.SessionFactory()
    socket = following(live, session)
    # A run that started after the subscribe: the feed follows it from its first event.
    run = factories.RunFactory(session=session, status=RunStatus.RUNNING)
    for _ in range(50):  # a flood: each forgery must be dropped at once, not waited out
        forger.forge_run(session.pk, run.pk, range(1, 4))
        forger.forge_the_rest(session.pk, session.project.owner_id)
    assert forger.sent == 50 * 3 * 7
    # Real events, published after commit by this process's notify.Publisher, as a view's are.
    journal.append_batch(run.pk, [delta("real one "), delta("real two "), delta("real three")])
    seen = socket.until(lambda f: is_forged(f) or (f["type"] == "event" and f["event"]["seq"] == 3))
    assert not [f for f in seen if is_forged(f)], "a forged frame reached the socket"
    deltas = [f["event"]["payload"]["delta"] for f in seen if f["type"] == "event"]
    assert deltas == ["real one ", "real two ", "real three"]
    # The forged sign-in ring closed nothing: the socket still answers, and nothing else came.
    socket.send(type="ping")
    after = socket.until(lambda f: f["type"] == "pong")
    assert not [f for f in after if is_forged(f) or f["type"] == "event"]
    assert live.daphne is not None and "failed authentication" in live.daphne.log()


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("layer", ["redis"], indirect=True)
def test_a_runners_turn_streams_whole_while_a_forger_floods_every_group(
    live: LiveStack, forger: Forger
) -> None:
    live.start_daphne(**NO_POLL)
    live.start_runner()
    session = factories.SessionFactory()
    socket = following(live, session)
    # Submitted through the socket: the web's own doorbells (the runners', the session's) ring;
    # the runner's journal messages carry the turn.
    socket.send(type="submit", client_id="held-turn", text="hold please")
    answer = socket.until(lambda f: f["type"] == "submitted" and f["client_id"] == "held-turn")[-1]
    run_id = int(answer["result"]["run_id"])
    seen = socket.until(lambda f: f["type"] == "event" and f["event"]["seq"] >= 3)
    stop = threading.Event()

    def spray() -> None:
        # The run's next seqs, and well past them, for as long as the turn streams.
        while not stop.is_set():
            forger.forge_run(session.pk, run_id, range(1, 400))
            forger.forge_the_rest(session.pk, session.project.owner_id)
            stop.wait(0.02)  # pacing only: a few hundred forgeries a second

    sprayer = threading.Thread(target=spray, daemon=True)
    sprayer.start()
    try:
        seen += socket.until(lambda f: is_forged(f) or (f["type"] == "event" and f["event"]["seq"] >= 30))
        release(session.project.path)
        if not any(is_forged(f) for f in seen):
            seen += socket.until(lambda f: is_forged(f) or (f["type"] == "event" and f["event"]["terminal"]))
    finally:
        stop.set()
        sprayer.join(30)
    assert forger.sent > 0
    assert not [f for f in seen if is_forged(f)], "a forged frame reached the socket"
    events = [f["event"] for f in seen if f["type"] == "event" and f["event"]["run_id"] == run_id]
    last_seq = Run.objects.values_list("last_seq", flat=True).get(pk=run_id)
    assert [e["seq"] for e in events] == list(range(1, last_seq + 1))
    assert events[-1]["payload"]["state"] == "completed"


def test_the_redis_layer_refuses_to_run_unsealed() -> None:
    with pytest.raises(ImproperlyConfigured):
        SealedPubSubLayer(hosts=["redis://127.0.0.1:6379/0"])
    layer = redis_channel_layer("redis://127.0.0.1:6379/0", "p", "one key")
    assert layer["BACKEND"] == "hermesweb.channel_layer.SealedPubSubLayer"
    # Derived, never SECRET_KEY itself; another SECRET_KEY, another key.
    keys = layer["CONFIG"]["symmetric_encryption_keys"]
    assert keys != ["one key"] and keys != sealing_keys("another key")
