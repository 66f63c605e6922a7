"""The RFC's ten "Recovery And Replay Invariants", one test each, plus one coherent timeline.

At the server, a session switch, a refresh and a reconnect all come down to
reading the session's intents and transcript again (the API, or a new
socket's snapshot and replay); a process boundary is a `kill -9` of the runner
and a new one. Real runners and the bundled demo agent throughout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.db import transaction
from django.test import Client

from intents.models import IntentKind, IntentState, PendingIntent
from intents.services import do_delete_intent, drain
from projects.models import Session
from runs.controls import do_cancel, do_stop_and_send
from runs.journal import AlreadyTerminal, done_event
from runs.models import RunSource, RunStatus
from runs.services import do_submit_message
from runs.transcript import apply_event, materialize
from runs.turns import finish_run
from tests import factories
from tests.support.hold import release
from tests.support.intents import (
    FAST_DEMO,
    as_json,
    fresh,
    open_ids,
    pause,
    queue,
    replay,
    run_from,
    runner,  # noqa: F401
    runs_of,
    send,
    settled,
    spawn_runner,
    start_turn,
    steer_items,
    steer_rows,
    switch_away_and_back,
    turn_of,
    view,
    wait_intent,
)
from tests.support.live import LiveStack, layer, live, session_cookie  # noqa: F401
from tests.support.procs import Proc, wait_for
from tests.support.runs import (
    assert_journal_well_formed,
    events,
    refreshed,
    state,
    types,
    wait_event,
    wait_status,
)

pytestmark = pytest.mark.django_db(transaction=True)

JSON = "application/json"


def as_paged(state: dict[str, Any]) -> dict[str, Any]:
    """A turn's state as a transcript page may carry it: without the run's joined `text` and
    `reasoning`, which its items already hold (runs.transcript)."""
    return {key: value for key, value in state.items() if key not in ("text", "reasoning")}


def steer_now(session: Session, text: str) -> PendingIntent:
    result = send(session, text, mode="steer")
    assert result.kind == IntentKind.STEER and result.intent is not None, result
    return result.intent


# ---------------------------------------------------------------- 1, 2: an accepted steer stays visible


def test_invariant_1_an_accepted_steer_stays_visible_after_switching_away_and_back(
    runner: Proc, api: Client, session: Session
) -> None:
    busy = start_turn(session, "hold", started="token.delta")
    steer = steer_now(session, "stay inside src")
    wait_event(busy, "steer.delivered", intent_id=steer.pk)
    follow_up = queue(session, "fast follow up")
    other = factories.SessionFactory(project=session.project)
    elsewhere_turn = send(other, "fast busy elsewhere")
    expected = [{"kind": "steer", "text": "stay inside src", "intent_id": steer.pk}]

    live_before, _, live_after = switch_away_and_back(api, session, other)
    assert steer_items(turn_of(live_before, busy)) == steer_items(turn_of(live_after, busy)) == expected

    # Away while this turn ends and the next one runs; back afterwards.
    release(session.project.path)
    settled(session)
    assert elsewhere_turn.run is not None
    wait_status(elsewhere_turn.run, RunStatus.COMPLETED, log=runner.log)
    _, elsewhere, back = switch_away_and_back(api, session, other)
    assert steer_items(turn_of(back, busy)) == expected
    assert not steer_items(turn_of(back, run_from(follow_up)))
    assert all(not steer_items(turn) for turn in elsewhere["turns"])


def test_invariant_2_an_accepted_steer_stays_visible_after_the_transcript_is_rebuilt_from_the_server(
    runner: Proc, api: Client, session: Session
) -> None:
    busy = start_turn(session, "hold", started="token.delta")
    steer = steer_now(session, "skip the slow checks")
    wait_event(busy, "steer.delivered", intent_id=steer.pk)
    mid_run = view(api, session)
    release(session.project.path)
    wait_status(busy, RunStatus.COMPLETED, log=runner.log)

    rebuilt = [view(api, session) for _ in range(2)]

    assert rebuilt[0] == rebuilt[1]
    for body in (mid_run, *rebuilt):
        assert [i["text"] for i in steer_items(turn_of(body, busy))] == ["skip the slow checks"]
    items = turn_of(rebuilt[0], busy)["state"]["items"]
    kinds = [item["kind"] for item in items]
    at = kinds.index("steer")
    # A control event inside the turn: after the agent's first words, before its last.
    assert kinds.index("text") < at < len(kinds) - 1
    assert as_paged(as_json(materialize(events(busy)))) == as_paged(turn_of(rebuilt[0], busy)["state"])


# ---------------------------------------------------------------- 3: queue items belong to their session


def test_invariant_3_a_pending_queue_item_stays_attached_to_its_originating_session(
    runner: Proc, api: Client, session: Session
) -> None:
    # Another project's session: two held turns in one working directory would race for a release.
    other = factories.SessionFactory(project__owner=session.project.owner)
    start_turn(session, "hold", started="token.delta")
    start_turn(other, "hold", started="token.delta")
    mine = queue(session, "fast mine")
    theirs = queue(other, "fast theirs")

    for _ in range(2):
        assert open_ids(view(api, session)) == [mine.pk]
        assert open_ids(view(api, other)) == [theirs.pk]

    release(session.project.path)
    release(other.project.path)
    settled(session)
    settled(other)
    assert (run_from(mine).session_id, run_from(theirs).session_id) == (session.pk, other.pk)
    assert [r.prompt_text for r in runs_of(session)] == ["hold", "fast mine"]
    assert [r.prompt_text for r in runs_of(other)] == ["hold", "fast theirs"]


# ---------------------------------------------------------------- 4: stop-and-send across boundaries


def test_invariant_4_a_pending_stop_and_send_stays_recoverable_across_cancel_refresh_and_reconnect(
    runners: list[Proc], logs: Path, api: Client, session: Session
) -> None:
    doomed = spawn_runner(runners, logs, "doomed")
    busy = start_turn(session, "hold", started="token.delta")
    item = queue(session, "fast after the outage")
    pause(doomed, session)
    assert do_stop_and_send(item).status == "accepted"
    stopping = [(item.pk, IntentKind.STOP_AND_SEND, IntentState.STOPPING)]
    assert [(i["id"], i["kind"], i["state"]) for i in view(api, session)["intents"]] == stopping

    doomed.kill9()  # the process boundary: cancel requested, never applied

    assert [(i["id"], i["kind"], i["state"]) for i in view(api, session)["intents"]] == stopping
    rescuer = spawn_runner(runners, logs, "rescuer")
    wait_status(busy, RunStatus.INTERRUPTED, log=rescuer.log)
    nxt = run_from(item)
    assert (nxt.source, nxt.prompt_text, nxt.client_id) == (
        RunSource.STOP_AND_SEND,
        "fast after the outage",
        item.client_id,
    )
    wait_status(nxt, RunStatus.COMPLETED, log=rescuer.log)
    after = view(api, session)
    assert [t["run_id"] for t in after["turns"]] == [busy.pk, nxt.pk]
    assert after["intents"] == []
    assert types(busy).count("run.started") == 1 and types(nxt).count("run.started") == 1
    assert_journal_well_formed(busy)


# ---------------------------------------------------------------- 5: leftover steer


def test_invariant_5_a_leftover_steer_becomes_a_queued_next_turn_and_never_disappears(
    runners: list[Proc], logs: Path, api: Client, session: Session
) -> None:
    doomed = spawn_runner(runners, logs, "doomed")
    busy = start_turn(session, "hold", started="token.delta")
    doomed.kill9()
    steer = steer_now(session, "also cover the docs")
    # A replacement is already waiting to go first, so the leftover can be seen in the queue.
    replacement = queue(session, "toolloop")
    assert do_stop_and_send(replacement).status == "accepted"

    rescuer = spawn_runner(runners, logs, "rescuer")
    wait_status(busy, RunStatus.INTERRUPTED, log=rescuer.log)
    waiting = wait_intent(steer, kind=IntentKind.QUEUE, state=IntentState.WAITING)
    assert waiting.source == RunSource.LEFTOVER_STEER and waiting.source_meta["steer_run_id"] == busy.pk
    shown = next(i for i in view(api, session)["intents"] if i["id"] == steer.pk)
    assert (shown["kind"], shown["source"], shown["text"]) == (
        "queue",
        "leftover_steer",
        "also cover the docs",
    )
    assert "ended before this steer reached the agent" in shown["reason"]

    settled(session)
    turns = [(r.prompt_text, r.source) for r in runs_of(session)]
    assert turns == [
        ("hold", RunSource.COMPOSER),
        ("toolloop", RunSource.STOP_AND_SEND),
        ("also cover the docs", RunSource.LEFTOVER_STEER),
    ]
    assert refreshed(run_from(steer)).status == RunStatus.COMPLETED


# ---------------------------------------------------------------- 6: replay is idempotent


def test_invariant_6_replaying_run_events_never_duplicates_steers_queue_items_or_replacements(
    runner: Proc, api: Client, session: Session
) -> None:
    busy = start_turn(session, "hold", started="token.delta")
    steer = steer_now(session, "one steer only")
    wait_event(busy, "steer.delivered", intent_id=steer.pk)
    item = queue(session, "fast one queued item")
    # Enough of a journal after the steer for the overlapping replays below to cut into.
    wait_for(lambda: len(events(busy)) >= 12, what="the held turn to stream on")
    release(session.project.path)
    wait_status(busy, RunStatus.COMPLETED, log=runner.log)
    settled(session)
    nxt = run_from(item)
    journal = events(busy)

    once = as_json(materialize(journal))
    assert as_json(materialize(journal + journal)) == once
    overlapping = materialize(journal[:10])
    for event in journal[5:]:
        apply_event(overlapping, event)
    assert as_json(overlapping) == once
    assert replay(api, busy, limit=3, overlap=2) == once
    assert as_paged(once) == as_paged(turn_of(view(api, session), busy)["state"])
    assert len(steer_items(turn_of(view(api, session), busy))) == 1 == len(steer_rows(busy))

    # Resending, re-draining and re-finishing change nothing.
    for sent in (steer, item):
        again = do_submit_message(session, client_id=sent.client_id, text=sent.text, mode="auto")
        assert again.duplicate
    with transaction.atomic():
        assert drain(Session.objects.lock(session.pk)) is None
    with pytest.raises(AlreadyTerminal):
        finish_run(busy.pk, [done_event(RunStatus.COMPLETED)])
    assert runs_of(session) == [busy, nxt]
    assert PendingIntent.objects.filter(session=session).count() == 2
    assert view(api, session)["intents"] == []


# ---------------------------------------------------------------- 7: switching hides, never erases


def test_invariant_7_switching_sessions_hides_pending_intent_but_never_erases_it(
    runner: Proc, api: Client, session: Session
) -> None:
    busy = start_turn(session, "hold", started="token.delta")
    kept = [queue(session, f"fast kept {n}") for n in range(2)]
    other = factories.SessionFactory(project=session.project)
    before = view(api, session)["intents"]

    # Meanwhile in the other session: a turn, a queued item, and that item withdrawn.
    # Held as well, in the same directory: it is cancelled, so no release is raced for.
    elsewhere = start_turn(other, "hold", started="token.delta")
    withdrawn = queue(other, "fast withdrawn")
    assert do_delete_intent(withdrawn, version=withdrawn.version).status == "accepted"
    assert open_ids(view(api, other)) == []
    assert do_cancel(elsewhere).status == "accepted"
    wait_status(elsewhere, RunStatus.CANCELLED, log=runner.log)

    assert view(api, session)["intents"] == before
    assert [i.state for i in map(fresh, kept)] == [IntentState.WAITING, IntentState.WAITING]
    assert do_cancel(busy).status == "accepted"  # a plain Stop ends the turn; the queue still drains
    settled(session)
    assert [r.prompt_text for r in runs_of(session)] == ["hold", "fast kept 0", "fast kept 1"]


# ---------------------------------------------------------------- 8, 9: a delivered steer is final


def test_invariant_8_a_delivered_steer_is_not_represented_as_an_editable_queue_item(
    runner: Proc, api: Client, session: Session
) -> None:
    busy = start_turn(session, "hold", started="token.delta")
    steer = steer_now(session, "rename nothing")
    wait_event(busy, "steer.delivered", intent_id=steer.pk)
    current = wait_intent(steer, state=IntentState.DELIVERED)

    assert steer.pk not in open_ids(view(api, session))
    settled_list = api.get(f"/api/sessions/{session.pk}/intents", {"include_closed": "true"}).json()[
        "intents"
    ]
    assert [(i["id"], i["kind"], i["state"]) for i in settled_list] == [
        (steer.pk, IntentKind.STEER, IntentState.DELIVERED)
    ]
    url = f"/api/intents/{steer.pk}"
    assert api.patch(url, {"version": current.version, "text": "x"}, content_type=JSON).json()["status"] == (
        "not_active"
    )
    assert api.delete(f"{url}?version={current.version}").json()["status"] == "not_active"
    assert api.post(f"{url}/stop-and-send").json()["status"] == "not_active"
    release(session.project.path)
    wait_status(busy, RunStatus.COMPLETED, log=runner.log)
    assert fresh(steer).version == current.version and fresh(steer).text == "rename nothing"


def test_invariant_9_a_waiting_item_may_be_upgraded_to_steer_but_the_delivery_is_irreversible(
    runner: Proc, api: Client, session: Session
) -> None:
    busy = start_turn(session, "hold", started="token.delta")
    item = queue(session, "fast prefer the short path")
    assert item.kind == IntentKind.QUEUE and item.state == IntentState.WAITING

    assert api.post(f"/api/intents/{item.pk}/steer").json()["status"] == "accepted"
    wait_event(busy, "steer.delivered", intent_id=item.pk)
    release(session.project.path)
    wait_status(busy, RunStatus.COMPLETED, log=runner.log)
    settled(session)

    # The run's end does not hand it back to the queue: it was delivered, not left over.
    row = fresh(item)
    assert (row.kind, row.state, row.source, row.run_id) == (
        IntentKind.STEER,
        IntentState.DELIVERED,
        "composer",
        None,
    )
    assert api.post(f"/api/intents/{item.pk}/steer").json()["status"] == "duplicate"
    assert runs_of(session) == [busy]


# ---------------------------------------------------------------- 10: Stop promotes, never drops


def test_invariant_10_stop_on_a_waiting_item_promotes_it_to_stop_and_send_instead_of_dropping_it(
    runner: Proc, api: Client, session: Session
) -> None:
    busy = start_turn(session, "hold", started="token.delta")
    item = queue(session, "fast promote me")

    answer = api.post(f"/api/intents/{item.pk}/stop-and-send").json()

    assert answer["status"] == "accepted"
    assert (answer["intent"]["id"], answer["intent"]["text"]) == (item.pk, "fast promote me")
    assert answer["intent"]["kind"] == IntentKind.STOP_AND_SEND
    assert answer["intent"]["state"] in (IntentState.STOPPING, IntentState.DISPATCHED)
    wait_status(busy, RunStatus.CANCELLED, log=runner.log)
    nxt = run_from(item)
    row = fresh(item)
    assert (row.state, row.kind, row.text) == (
        IntentState.DISPATCHED,
        IntentKind.STOP_AND_SEND,
        "fast promote me",
    )
    assert (nxt.prompt_text, nxt.client_id, nxt.source) == (
        "fast promote me",
        item.client_id,
        RunSource.STOP_AND_SEND,
    )
    wait_status(nxt, RunStatus.COMPLETED, log=runner.log)
    assert "fast promote me" in state(nxt)["text"]
    assert not PendingIntent.objects.filter(state=IntentState.DELETED).exists()


# ---------------------------------------------------------------- RFC: one coherent timeline


def test_the_settled_render_and_a_live_replay_produce_one_coherent_timeline(
    live: LiveStack, api: Client, user: Any, session: Session
) -> None:
    live.start_daphne()
    live.start_runner(HERMESWEB_DEMO_DELAY=FAST_DEMO)
    cookie = session_cookie(user)
    first = live.socket(session.pk, cookie)
    first.subscribe()
    busy = start_turn(session, "hold", started="token.delta")
    steer = steer_now(session, "mind the timeline")
    seen = first.events_until(busy.pk, lambda e: e["type"] == "steer.delivered")
    first.close()
    release(session.project.path)

    # Reconnect from a cursor a little behind what was shown: the overlap must not duplicate anything.
    second = live.socket(session.pk, cookie)
    second.subscribe({busy.pk: max(0, seen[-1]["seq"] - 3)})
    rest = second.events_to_terminal(busy.pk)
    live_state = materialize([])
    for event in [*seen, *rest]:
        apply_event(live_state, event)

    settled_render = as_paged(turn_of(view(api, session), busy)["state"])
    assert as_paged(as_json(live_state)) == settled_render
    assert [i for i in settled_render["items"] if i["kind"] == "steer"] == [
        {"kind": "steer", "text": "mind the timeline", "intent_id": steer.pk}
    ]
    late = live.socket(session.pk, cookie)
    late.subscribe({busy.pk: 0})
    full = late.events_to_terminal(busy.pk)
    assert as_paged(as_json(materialize(full))) == settled_render
