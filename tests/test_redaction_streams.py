"""A secret split across streamed pieces never reaches the journal in clear, and no text is lost.

The journal redacts each row; the writer's DeltaGuard (runs/runner/redact_stream.py) holds back
the tail of a stream that could still be the start of a secret, so no row boundary falls inside
one. Every test here fails with the guard turned into a pass-through (`DeltaGuard.feed`
returning its events as they came).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from hypothesis import strategies as st

from runs.journal import NewEvent, done_event
from runs.models import JournalEvent, RunStatus
from runs.redaction import OPENING, REDACTED, opening_start, redact_text
from runs.runner import redact_stream
from runs.runner.jobs import ReplayedTurn, turn_body
from runs.runner.redact_stream import DeltaGuard
from runs.runner.writer import JournalWriter
from tests import factories
from tests.support.hermes import AgentConfig
from tests.support.scripted_llm import ScriptedLLM

SECRETS = {
    "openai": "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWX123",
    "aws": "AKIAIOSFODNN7EXAMPLE",
    "password": "password=hunter2secret",
    "bearer": "Bearer abcdefghijklmnop",
    "pem": "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
    "url": "https://deploy:pa55word@example.com/repo",
    "github": "github_pat_11ABCDEFG0123456789abcdefghij",
    # A keyword inside a bearer's token: each pattern reads the text as it came.
    "overlap": "Bearer sk-TOKEN: qrstuvwx98765432",
    # A value that took the next keyword runs on into that keyword's value.
    "run-on": "secret: api_key: zyxwvuts13572468",
}
# What must never be stored: the part of each secret that redaction replaces.
HIDDEN = {
    "openai": "ABCDEFGHIJKLMNOP",
    "aws": "IOSFODNN7EXAMPLE",
    "password": "hunter2secret",
    "bearer": "abcdefghijklmnop",
    "pem": "MIIEowIBAAKCAQEA",
    "url": "pa55word",
    "github": "0123456789abcdefghij",
    "overlap": "qrstuvwx98765432",
    "run-on": "zyxwvuts13572468",
}


def text_with(name: str) -> str:
    return f"Here it is: {SECRETS[name]} and the rest."


def delta(text: str, message_id: str = "m1") -> NewEvent:
    return NewEvent("token.delta", {"message_id": message_id, "delta": text})


def guarded_rows(pieces: list[str]) -> list[str]:
    """Each delta the guard lets out, as a row of its own (the strictest cut), redacted as stored."""
    guard = DeltaGuard()
    out = [event for piece in pieces for event in guard.feed([delta(piece)])] + guard.release()
    return [redact_text(event.payload["delta"]) for event in out]


@pytest.mark.parametrize("name", list(SECRETS))
def test_a_secret_split_at_every_offset_across_two_pieces_is_stored_redacted(name: str) -> None:
    full = text_with(name)
    expected = redact_text(full)
    assert HIDDEN[name] not in expected and REDACTED in expected
    for cut in range(len(full) + 1):
        rows = guarded_rows([full[:cut], full[cut:]])
        assert "".join(rows) == expected, f"cut at {cut}: {rows}"
        assert not any(HIDDEN[name] in row for row in rows)


@pytest.mark.parametrize("name", list(SECRETS))
def test_a_secret_split_at_every_pair_of_offsets_across_three_pieces_is_stored_redacted(name: str) -> None:
    full = text_with(name)
    expected = redact_text(full)
    start, end = full.index(SECRETS[name]), full.index(SECRETS[name]) + len(SECRETS[name])
    for first in range(start - 2, end + 2):
        for second in range(first, end + 3):
            rows = guarded_rows([full[:first], full[first:second], full[second:]])
            assert "".join(rows) == expected, f"cuts at {first}, {second}: {rows}"


def test_a_stream_one_character_at_a_time_is_stored_as_the_whole_text_redacted() -> None:
    full = " then ".join(SECRETS.values())
    rows = guarded_rows(list(full))
    assert "".join(rows) == redact_text(full)
    assert not any(hidden in "".join(rows) for hidden in HIDDEN.values())


def test_a_secret_longer_than_the_hold_is_redacted_whole_and_its_rest_dropped() -> None:
    key = "sk-" + "A" * 3 * redact_stream.HOLD_CHARS
    full = f"key {key} done"
    pieces = [full[i : i + 7] for i in range(0, len(full), 7)]
    rows = guarded_rows(pieces)
    assert "".join(rows) == f"key {REDACTED} done"


def test_ordinary_text_goes_out_at_once_and_only_a_possible_start_is_held() -> None:
    guard = DeltaGuard()
    assert [e.payload["delta"] for e in guard.feed([delta("Hello, world.")])] == ["Hello, world."]
    # "sk" could begin a key: held, and sent with the next piece.
    assert [e.payload["delta"] for e in guard.feed([delta(" Ask")])] == [" Ask"]
    assert [e.payload["delta"] for e in guard.feed([delta(" sk")])] == [" "]
    assert [e.payload["delta"] for e in guard.feed([delta("y is blue")])] == ["sky is blue"]


def reference_opening(text: str, start: int = 0) -> int | None:
    """The rule opening_start's shortcuts must give the same answer as: a plain search."""
    found = OPENING.search(text, start)
    return None if found is None else found.start()


# What follows the first character in an opening of each kind: a word's rest, a URL's colon.
WORD_RESTS = [
    "earer", "asic", "k-", "hp_", "ithub_pat_", "oxb-", "KIA", "Iza", "f_", "w_", "----BEGIN ", "pi_key",
    "assword", "ecret", "oken", "rivate_key", ":", "://", "",
]  # fmt: skip


def test_every_character_an_opening_may_begin_with_is_tried() -> None:
    # Whatever character OPENING takes as an opening's first (case folding included, as `re`
    # does it), opening_start must try it there, in the middle of a text as at its start.
    for code in range(0x10000):
        char = chr(code)
        for rest in WORD_RESTS:
            if OPENING.match(f"{char}{rest}") is not None:
                assert opening_start(f"{char}{rest}") == 0, (hex(code), rest)
                assert opening_start(f"1 {char}{rest}") == 2, (hex(code), rest)


FRAGMENTS = [
    "bearer ", "Basic ", "sk-", "rk-", "pk-", "ghp_", "github_pat_", "xoxb-", "AKIA", "AIza", "hf_",
    "hw_", "-----BEGIN ", "RSA PRIVATE KEY-----", "-----END ", "api_key", "API-KEY", "password",
    "passwd", "Secret", "token", "private_key", "https://", "ftp:", "user", "pa55", ":", "=", "/",
    "@", " ", "\n", "'", '"', ",", ";", "\u017f", "\u212a", "İ", "é", "日本", "abc", "XYZ", "123", "-", "_",
    ".", "+", "a", "s", "t", "p", "https://deploy:", "pa55word",
]  # fmt: skip


@hypothesis.settings(max_examples=2000, derandomize=True, database=None, deadline=None)
# Openings that begin long before the text's end: a URL's credentials, a keyword's value.
@hypothesis.example(pieces=["see https://deploy:pa55wordpa55wordpa55word"], start=0)
@hypothesis.example(pieces=["the password: hunter2hunter2hunter2"], start=0)
@hypothesis.example(pieces=["x" * 300, "Bearer abcdefghijklmnopqrstuvwxyz"], start=280)
@hypothesis.given(
    pieces=st.lists(st.sampled_from(FRAGMENTS), max_size=40), start=st.integers(min_value=0, max_value=300)
)
def test_opening_start_finds_what_a_plain_search_finds(pieces: list[str], start: int) -> None:
    text = "".join(pieces)
    start = min(start, len(text))
    assert opening_start(text, start) == reference_opening(text, start)


def test_a_held_tail_goes_out_before_any_other_event_and_another_stream() -> None:
    guard = DeltaGuard()
    out = guard.feed([delta("the api"), NewEvent("tool.started", {"tool_call_id": "t"})])
    assert [(e.type, e.payload.get("delta")) for e in out] == [
        ("token.delta", "the "),
        ("token.delta", "api"),
        ("tool.started", None),
    ]
    out = guard.feed(
        [delta("a tok", "m1"), NewEvent("reasoning.delta", {"reasoning_id": "r1", "delta": "x"})]
    )
    assert [(e.type, e.payload["delta"]) for e in out] == [
        ("token.delta", "a "),
        ("token.delta", "tok"),
    ]
    assert [e.payload["delta"] for e in guard.release()] == ["x"]


# ------------------------------------------------------------------ through the writer and journal


def stored_text(run: Any) -> tuple[list[str], str]:
    rows = JournalEvent.objects.filter(run=run, type="token.delta").order_by("seq")
    deltas = [row.payload["delta"] for row in rows]
    return deltas, "".join(deltas)


def write_pieces(run: Any, pieces: list[str], final_state: str) -> None:
    async def scenario() -> None:
        writer = JournalWriter(run.pk, window_ms=0)  # every piece its own flush: its own row
        for piece in pieces:
            writer.add([delta(piece)])
            await writer.flush()
        await writer.finish([done_event(final_state)])

    asyncio.run(scenario())


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("final_state", [RunStatus.COMPLETED, RunStatus.CANCELLED, RunStatus.FAILED])
def test_the_journal_and_transcript_hold_the_text_redacted_and_the_held_tail_before_done(
    final_state: str,
) -> None:
    from runs.transcript import materialize

    run = factories.RunFactory(status="running")
    full = f"{text_with('openai')} Then {SECRETS['password']} sk"  # ends on a held "sk"
    pieces = [full[i : i + 9] for i in range(0, len(full), 9)]
    write_pieces(run, pieces, final_state)
    deltas, joined = stored_text(run)
    assert len(deltas) > 2  # written in several rows, as streamed
    assert joined == redact_text(full)
    assert joined.endswith(" sk")  # the held tail was written, before the terminal event
    events = list(JournalEvent.objects.filter(run=run).order_by("seq"))
    assert events[-1].type == "done" and events[-2].type == "token.delta"
    assert materialize(events)["text"] == redact_text(full)
    stored = json.dumps([e.payload for e in events])
    assert HIDDEN["openai"] not in stored and HIDDEN["password"] not in stored


@pytest.mark.django_db(transaction=True)
def test_a_secret_split_across_a_replayed_history_is_imported_redacted() -> None:
    from runs.runner.jobs import MERGE_LIMIT

    # Merged rows close at the first piece past MERGE_LIMIT: here, inside the key.
    full = "x" * (MERGE_LIMIT - 19) + " " + text_with("aws")
    updates = [
        {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": full[i : i + 5]}}
        for i in range(0, len(full), 5)
    ]
    body = turn_body(ReplayedTurn(prompt="hi", updates=updates))
    rows = [redact_text(e.payload["delta"]) for e in body if e.type == "token.delta"]
    assert len(rows) == 2
    assert "".join(rows) == redact_text(full)


# ------------------------------------------------------------------ real agents


def echo_splits_after_bearer(prompt: str) -> bool:
    """Whether the demo agent's echo of `prompt` ends a chunk right after "Bearer "."""
    from runs.demo_agent.turn import split_chunks

    echoed = f"## Demo answer\n\nYou said:\n\n> {prompt}\n\n"
    return any(chunk.endswith("Bearer ") for chunk in split_chunks(echoed))


@pytest.mark.django_db(transaction=True)
def test_the_demo_agent_echoing_a_secret_across_chunks_stores_it_redacted(runners: list, logs: Path) -> None:
    from tests.support.procs import start_runner
    from tests.support.runs import run_of, state, submit, wait_status

    # The demo agent echoes the prompt three words to a chunk: "Bearer " ends one chunk and
    # the token starts the next; 0.2 s apart, each is a row of its own.
    prompt = f"one two Bearer {HIDDEN['bearer']}"
    assert echo_splits_after_bearer(prompt)
    runner = start_runner(logs, "r-redact", HERMESWEB_DEMO_DELAY="0.2")
    runners.append(runner)
    session = factories.SessionFactory(project__agent="demo")
    run = run_of(submit(session, prompt))
    wait_status(run, RunStatus.COMPLETED, timeout=60, log=runner.log)
    deltas, joined = stored_text(run)
    assert "Bearer " + REDACTED in joined
    assert not any(HIDDEN["bearer"] in d for d in deltas)
    assert "Bearer " + REDACTED in state(run)["text"]


@pytest.fixture
def hermes_runner(runners: list, logs: Path, hermes_agent_config: AgentConfig) -> Iterator[Any]:
    from tests.support.procs import start_runner

    agents = json.dumps({"hermes": hermes_agent_config})
    proc = start_runner(logs, "hermes-redact", HERMESWEB_AGENTS=agents)
    runners.append(proc)
    yield proc


@pytest.fixture
def hermes_session(transactional_db: None, settings: Any, hermes_agent_config: AgentConfig) -> Any:
    from runs.agents import load_agents

    config = json.dumps({"hermes": hermes_agent_config})
    configured = load_agents(settings.DATA_DIR, {"HERMESWEB_AGENTS": config})
    settings.HERMESWEB_AGENTS = {**settings.HERMESWEB_AGENTS, "hermes": configured["hermes"]}
    return factories.SessionFactory(project__agent="hermes")


def streamed_by_hermes(
    session: Any, runner: Any, scripted_llm: ScriptedLLM, answer: str, chunks: int
) -> tuple[Any, list[str], str]:
    """The scripted model streams `answer` in `chunks` pieces through hermes-acp: the run and its rows."""
    from tests.support.runs import assert_journal_well_formed, run_of, submit, wait_status
    from tests.support.scripted_llm import text

    scripted_llm.enqueue(text(answer, chunks=chunks, chunk_delay=0.3))
    run = run_of(submit(session, "Show me the key"))
    wait_status(run, RunStatus.COMPLETED, timeout=90, log=runner.log)
    assert_journal_well_formed(run)
    deltas, joined = stored_text(run)
    assert len(deltas) >= 2, deltas  # streamed in pieces, not one row
    return run, deltas, joined


@pytest.mark.hermes
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", ["openai", "github", "overlap", "run-on"])
def test_hermes_streaming_a_secret_split_across_chunks_stores_it_redacted(
    hermes_runner: Any, hermes_session: Any, scripted_llm: ScriptedLLM, name: str
) -> None:
    from tests.support.runs import state

    answer = text_with(name)  # three chunks: the key is cut twice
    run, deltas, joined = streamed_by_hermes(hermes_session, hermes_runner, scripted_llm, answer, chunks=3)
    assert redact_text(answer) in joined
    assert not any(HIDDEN[name][:8] in d or HIDDEN[name][8:] in d for d in deltas), deltas
    assert redact_text(answer) in state(run)["text"]


# A Google key may end in `-`: its pattern's closing `\b` then needs the word character after it,
# here a `Bearer` the guard holds back (it could begin a token). The first chunk ends there.
KEY_BEFORE_OPENING = "Key: AIzaSyD-0123456789abcdefghijklmnopqrst-Bearer "


@pytest.mark.hermes
@pytest.mark.django_db(transaction=True)
def test_hermes_streaming_a_key_that_ends_where_a_held_opening_begins_stores_it_redacted(
    hermes_runner: Any, hermes_session: Any, scripted_llm: ScriptedLLM
) -> None:
    from tests.support.runs import state

    rest = "abcdefghijklmnop and that is all."
    answer = KEY_BEFORE_OPENING + rest.ljust(len(KEY_BEFORE_OPENING))  # two equal chunks
    expected = redact_text(answer)
    assert "0123456789abcdefghij" not in expected and "abcdefghijklmnop" not in expected
    run, deltas, joined = streamed_by_hermes(hermes_session, hermes_runner, scripted_llm, answer, chunks=2)
    assert expected in joined
    assert not any("0123456789abcdefghij" in d for d in deltas)
    assert expected in state(run)["text"]
