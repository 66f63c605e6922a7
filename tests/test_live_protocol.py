"""The socket's wire format (runs.live.protocol): client frames parsed or refused, catch-up frames sized."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from runs.live import protocol
from runs.live.protocol import BadRequest, EventFrame, InvalidSubmit, Ping, Submit, Subscribe


def test_parse_accepts_ping_and_subscribe() -> None:
    assert protocol.parse_client_message('{"type": "ping"}') == Ping()
    assert protocol.parse_client_message('{"type": "subscribe"}') == Subscribe({})
    assert protocol.parse_client_message('{"type": "subscribe", "after": {"7": 3, "9": 0}}') == Subscribe(
        {7: 3, 9: 0}
    )


@pytest.mark.parametrize(
    "raw",
    [None, "", "{", "3", '{"type": 1}', '{"type": "subscribe", "after": {"٣": 1}}', "x" * 70000],
)
def test_parse_refuses_malformed_frames(raw: str | None) -> None:
    with pytest.raises(BadRequest):
        protocol.parse_client_message(raw)


def test_a_submit_is_parsed_as_the_posts_body_and_an_invalid_one_is_refused_field_by_field() -> None:
    submit = protocol.parse_client_message('{"type": "submit", "client_id": "c1", "text": "hi"}')
    assert isinstance(submit, Submit) and (submit.message.client_id, submit.message.text) == ("c1", "hi")

    with pytest.raises(InvalidSubmit) as refused:
        protocol.parse_client_message('{"type": "submit", "client_id": "c2", "text": "hi", "mode": "shout"}')
    answer = orjson.loads(refused.value.frame())
    assert (answer["type"], answer["client_id"]) == ("submitted", "c2")
    assert (answer["error"]["status"], answer["error"]["code"]) == (422, "validation_error")
    assert [detail["field"] for detail in answer["error"]["details"]] == ["mode"]


def test_catch_up_frames_carry_consecutive_envelopes_under_the_size_limit(monkeypatch: Any) -> None:
    monkeypatch.setattr(protocol, "CATCHUP_FRAME_CHARS", 100)
    pad = {3: "x" * 150}  # too big to share a frame; the others are 28 characters each
    rows = [(seq, seq == 6, f'{{"seq":{seq},"pad":"{pad.get(seq, "x" * 10)}"}}') for seq in range(1, 7)]

    frames = list(protocol.events_frames(9, rows))

    decoded = [orjson.loads(frame.text) for frame in frames]
    assert all(f["type"] == "events" and f["run_id"] == 9 for f in decoded)
    # In order, each once, as many per frame as fit; the oversized envelope travels alone.
    assert [[e["seq"] for e in f["events"]] for f in decoded] == [[1, 2], [3], [4, 5, 6]]
    assert [(frame.seq, frame.terminal) for frame in frames] == [(2, False), (3, False), (6, True)]


def test_a_socket_sends_one_event_as_an_event_frame_and_several_as_one_events_frame() -> None:
    envelopes = [{"run_id": 5, "seq": seq, "terminal": seq == 3} for seq in (1, 2, 3)]
    frames = protocol.envelope_frames(envelopes)
    assert frames[0] == EventFrame(1, False, protocol.event_frame(envelopes[0]))

    (alone,) = protocol.socket_frames(5, frames[:1])
    (together,) = protocol.socket_frames(5, frames)

    assert orjson.loads(alone.text) == {"type": "event", "event": envelopes[0]}
    assert orjson.loads(together.text) == {"type": "events", "run_id": 5, "events": envelopes}
    assert (together.seq, together.terminal) == (3, True)
    # Rows read from the journal are wrapped, not re-encoded: the same frames.
    rows = [(e["seq"], e["terminal"], orjson.dumps(e).decode()) for e in envelopes]
    assert protocol.row_frames(rows) == frames
