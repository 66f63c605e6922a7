"""Queued intents are capped per session (HERMESWEB_MAX_QUEUED_INTENTS): past it, 422 `queue_full`.

Every open intent rides in each socket snapshot, so an unbounded queue let one session's
snapshot outgrow the socket's frame limit and close it for good.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from intents.models import IntentState, PendingIntent
from runs.models import RunStatus
from tests.factories import RunFactory

pytestmark = pytest.mark.django_db

JSON = "application/json"
LIMIT = 3


@pytest.fixture
def busy(session: Any, settings: Any) -> Any:
    """A session with an active run, so messages queue; the cap lowered to LIMIT."""
    settings.HERMESWEB_MAX_QUEUED_INTENTS = LIMIT
    RunFactory(session=session, status=RunStatus.RUNNING)
    return session


def send(api: Client, session: Any, client_id: str, mode: str = "queue") -> Any:
    return api.post(
        f"/api/sessions/{session.pk}/messages",
        {"client_id": client_id, "text": f"message {client_id}", "mode": mode},
        content_type=JSON,
    )


def test_a_message_past_the_cap_is_refused_with_queue_full(api: Client, busy: Any) -> None:
    accepted = [send(api, busy, f"m{n}").status_code for n in range(LIMIT)]

    refused = send(api, busy, "one-too-many")

    assert accepted == [202] * LIMIT
    assert refused.status_code == 422
    assert refused.json()["code"] == "queue_full"
    assert PendingIntent.objects.filter(session=busy).count() == LIMIT


def test_a_steer_counts_against_the_same_cap(api: Client, busy: Any) -> None:
    for n in range(LIMIT):
        send(api, busy, f"m{n}")

    assert send(api, busy, "steer-too", mode="steer").json()["code"] == "queue_full"


def test_sending_a_queued_message_again_is_still_a_duplicate_not_a_refusal(api: Client, busy: Any) -> None:
    for n in range(LIMIT):
        send(api, busy, f"m{n}")

    again = send(api, busy, "m0")

    assert again.status_code == 202
    assert again.json()["duplicate"] is True


def test_room_in_the_queue_is_made_by_intents_that_are_no_longer_open(api: Client, busy: Any) -> None:
    for n in range(LIMIT):
        send(api, busy, f"m{n}")
    PendingIntent.objects.filter(session=busy, client_id="m0").update(state=IntentState.DELETED)

    assert send(api, busy, "after-delete").status_code == 202


def test_the_default_cap_is_configured() -> None:
    from django.conf import settings

    assert settings.HERMESWEB_MAX_QUEUED_INTENTS == 50
