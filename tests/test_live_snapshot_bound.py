"""The socket's `session` frame stays under SNAPSHOT_MAX_BYTES whatever waits in the queue.

Every open intent rides in the snapshot, and a full queue of 1 MB messages made a frame over
daphne's 1 MiB message limit, which closes the socket for good. Intents go out as previews
(`truncated`, `text_length`); the full text is at GET /api/intents/{id}.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from django.test import Client

from intents.models import IntentKind
from intents.previews import INTENT_PREVIEW_CHARS
from runs.live.protocol import session_frame
from runs.live.reads import SNAPSHOT_MAX_BYTES, session_snapshot
from tests import factories
from tests.support.live import LiveStack, layer, live, session_cookie  # noqa: F401

MAX_TEXT = 1_000_000  # MessageText's max_length
DAPHNE_MAX_MESSAGE = 1024 * 1024


def fill_queue(session: Any, count: int, char: str = "x") -> None:
    factories.PendingIntentFactory.create_batch(count, session=session, text=char * MAX_TEXT)


def frame_bytes(session_id: int) -> int:
    snapshot = session_snapshot(session_id)
    assert snapshot is not None
    return len(session_frame(snapshot).encode())


@pytest.mark.django_db
def test_a_full_queue_of_maximum_messages_stays_under_the_documented_bound(settings: Any) -> None:
    session = factories.SessionFactory()
    fill_queue(session, settings.HERMESWEB_MAX_QUEUED_INTENTS)

    assert frame_bytes(session.pk) <= SNAPSHOT_MAX_BYTES < DAPHNE_MAX_MESSAGE


@pytest.mark.django_db
def test_each_intent_is_a_preview_that_says_how_long_the_text_is(settings: Any) -> None:
    session = factories.SessionFactory()
    fill_queue(session, 3)
    short = factories.PendingIntentFactory(session=session, text="Then run the tests.")

    intents = session_snapshot(session.pk)["intents"]

    long = [i for i in intents if i["id"] != short.pk]
    assert all(len(i["text"]) == INTENT_PREVIEW_CHARS for i in long)
    assert all(i["truncated"] and i["text_length"] == MAX_TEXT for i in long)
    whole = next(i for i in intents if i["id"] == short.pk)
    assert whole["text"] == "Then run the tests." and whole["truncated"] is False


@pytest.mark.django_db
def test_text_that_json_escapes_badly_still_fits_by_shrinking_previews_then_omitting(settings: Any) -> None:
    # A control character takes six bytes as JSON (\u0001); a raised cap means more of them.
    settings.HERMESWEB_MAX_QUEUED_INTENTS = 400
    session = factories.SessionFactory()
    fill_queue(session, 400, char="\x01")

    snapshot = session_snapshot(session.pk)

    assert frame_bytes(session.pk) <= SNAPSHOT_MAX_BYTES
    assert len(snapshot["intents"]) + snapshot["intents_omitted"] == 400
    assert all(i["truncated"] for i in snapshot["intents"])


@pytest.mark.django_db
def test_the_full_text_is_still_served_by_the_intents_api(api: Client, session: Any) -> None:
    intent = factories.PendingIntentFactory(session=session, kind=IntentKind.QUEUE, text="y" * MAX_TEXT)

    whole = api.get(f"/api/intents/{intent.pk}").json()

    assert len(whole["text"]) == MAX_TEXT


@pytest.mark.embedded
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("layer", ["embedded"], indirect=True)
def test_a_socket_on_a_session_with_a_full_queue_of_big_messages_gets_its_snapshot(live: LiveStack) -> None:
    session = factories.SessionFactory()
    fill_queue(session, live.settings.HERMESWEB_MAX_QUEUED_INTENTS)
    live.start_daphne()
    socket = live.socket(session.pk, session_cookie(session.project.owner))

    socket.subscribe()
    snapshot = socket.session()

    assert len(snapshot["intents"]) == live.settings.HERMESWEB_MAX_QUEUED_INTENTS
    assert len(orjson.dumps({"type": "session", "session": snapshot})) <= SNAPSHOT_MAX_BYTES
    socket.send(type="ping")
    assert socket.until(lambda f: f["type"] == "pong")
