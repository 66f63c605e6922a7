"""Redaction's shortcuts give exactly what its plain rule gives: every pattern on the whole text.

runs/redaction.py skips a pattern when a substring test (its trigger) says it cannot match, tests
the IGNORECASE patterns' triggers on a folded copy of the text, remembers short texts found
clean, and a stream's DeltaGuard cuts rows only where no match can cross. Each shortcut is a
second statement of the rule, and a case it misses is a secret stored in clear (a `github_pat_`
token split after the shortcut's last 12 characters was one). These hold each to the plain rule.
"""

from __future__ import annotations

import re
import sys
from itertools import pairwise

import hypothesis
from hypothesis import strategies as st

from runs.journal import NewEvent
from runs.redaction import HOLD_CHARS, PATTERNS, REDACTED, redact_text, secret_spans
from runs.runner import redact_stream
from runs.runner.redact_stream import DeltaGuard
from tests.support.redaction import plainly_redacted


def ignorecase_letters_outside_ascii() -> dict[str, list[str]]:
    """Each ASCII letter's non-ASCII matches under IGNORECASE, as `re` decides it (not a list we keep)."""
    letter = re.compile("[a-z]", re.IGNORECASE)
    found: dict[str, list[str]] = {}
    for code in range(0x80, sys.maxunicode + 1):
        char = chr(code)
        if letter.fullmatch(char):
            for ascii_letter in "abcdefghijklmnopqrstuvwxyz":
                if re.fullmatch(ascii_letter, char, re.IGNORECASE):
                    found.setdefault(ascii_letter, []).append(char)
    return found


# A secret of each case-insensitive pattern: the keyword is what its trigger looks for.
KEYWORD_SECRETS = [
    "Bearer abcdefghijklmnop", "basic abcdefghijklmnop", "api_key=abcdefgh", "API-KEY: abcdefgh",
    "apikey=abcdefgh", "password=abcdefgh", "passwd: abcdefgh", "secret=abcdefgh", "token: abcdefgh",
    "private_key=abcdefgh", "privatekey = 'abcdefgh'",
]  # fmt: skip


def test_every_keyword_spelled_with_a_non_ascii_letter_ignorecase_matches_is_masked() -> None:
    # `re` lets four non-ASCII letters match ASCII ones under IGNORECASE; the triggers see a fold
    # of the text in which each must show as its ASCII letter, or the pattern is skipped.
    letters = ignorecase_letters_outside_ascii()
    assert letters, "no non-ASCII letter matches an ASCII one: the fold is not needed"
    tried = 0
    for secret in KEYWORD_SECRETS:
        keyword_end = re.search(r"[\s:=]", secret).start()  # type: ignore[union-attr]
        for index in range(keyword_end):
            for char in letters.get(secret[index].lower(), []):
                text = f"see {secret[:index]}{char}{secret[index + 1 :]} here"
                expected = plainly_redacted(text)
                assert REDACTED in expected, text
                assert redact_text(text) == expected, text
                tried += 1
    assert tried >= 20


# Pieces of secrets of every pattern, their keywords in other cases and with the four letters
# above, separators, and non-ASCII text the fold drops.
FRAGMENTS = [
    "Bearer ", "bAsIc ", "sk-", "sk-proj-", "rk-", "pk-", "ghp_", "gho_", "github_pat_", "xoxb-", "xoxs-",
    "AKIA", "AIza", "hf_", "hw_", "-----BEGIN ", "RSA PRIVATE KEY-----", "-----END ", "PRIVATE KEY-----",
    "api_key", "Api-Key", "APIKEY", "password", "PASSWD", "Secret", "token", "TOKEN", "private_key",
    "pa\u017f\u017fword", "to\u212aen", "pr\u0131vate", "ba\u017f\u0130c", "https://", "http", "ftp:",
    "://", "user", "pa55", ":", "=", " = ", "/", "@", " ", "\n", "\t", "'", '"', ",", ";", "é", "日本",
    "🙂", "abcdefgh", "ABCDEFGHIJKLMNOP", "0123456789", "x", "-", "_", ".", "+", "[REDACTED]",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n-----END RSA PRIVATE KEY-----",
]  # fmt: skip
# A secret's start, and a body long enough for any pattern's length (so whole secrets are common).
PREFIXES = [
    "Bearer ", "sk-", "sk-ant-", "ghp_", "github_pat_", "xoxb-", "AKIA", "AIza", "hf_", "hw_",
    "password=", "TOKEN: ", "https://u:", "ftp://deploy:",
]  # fmt: skip
# (No body holds a word the guard's shortcut looks for, as `gh` in `abcdefgh`: each would hide it.)
# One is longer than the guard holds (runs/redaction.py HOLD_CHARS).
BODIES = [
    "Z9Y8X7W6V5U4T3S2R1Q0P9N8M7L6K5J4I3H2", "z9y8x7w6v5_-0123456789_-u4t3s2r1q0", "pa55word@host/x",
    "z9_Y8-x7" * 40,
]  # fmt: skip


def texts(pieces: int) -> st.SearchStrategy[str]:
    """Up to `pieces` fragments and whole secrets, joined."""
    secret = st.builds(lambda prefix, body: prefix + body, st.sampled_from(PREFIXES), st.sampled_from(BODIES))
    return st.lists(st.one_of(st.sampled_from(FRAGMENTS), secret), max_size=pieces).map("".join)


TEXT = texts(16)


@hypothesis.settings(max_examples=3000, derandomize=True, database=None, deadline=None)
@hypothesis.given(text=TEXT)
def test_redaction_gives_what_every_pattern_on_the_whole_text_gives(text: str) -> None:
    expected = plainly_redacted(text)
    assert redact_text(text) == expected
    assert redact_text(text) == expected  # again: a short clean text now comes from the kept set


def starts_a_match_the_whole_lacks(text: str, cut: int) -> bool:
    return any(
        isinstance(pattern, re.Pattern) and pattern.match(text[cut:]) and not pattern.match(text, cut)
        for pattern, _ in PATTERNS
    )


def delta(text: str) -> NewEvent:
    return NewEvent("token.delta", {"message_id": "m1", "delta": text})


# A few pieces, so that a secret often has an opening or another secret right beside it.
SHORT_TEXT = texts(5)


@hypothesis.settings(max_examples=3000, derandomize=True, database=None, deadline=None)
# What the guard once got wrong: a key ending in `-` before an opening (its `\b` needs the next
# character), a URL's credentials before one (the look-behind needs the scheme's), a
# fine-grained GitHub token split after the shortcut's last 12 characters.
@hypothesis.example(text="AIzaabcdefghij0123456789_-abcdefghijsk-Bearer ", cuts=[])
@hypothesis.example(text="https://u:ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@Bearer ", cuts=[])
@hypothesis.example(text="github_pat_Z9Y8X7W6V5U4T3S2R1Q0P9N8M7L6K5J4I3H2", cuts=[30])
# A value that took the next keyword runs on into its value, across the agent's cuts.
@hypothesis.example(text="password=hunter2TOKEN: s3cr3tvalue and on", cuts=[20, 23])
@hypothesis.example(text="secret: token: abcdef12 x", cuts=[10])
# Secrets longer than the hold: the rest is dropped as far as the pattern would run (U+017F, long
# s, is an `s` to the bearer's IGNORECASE; `_` runs on in a fine-grained GitHub token).
@hypothesis.example(text="Bearer " + "z9_Y8-x7" * 40 + "pa\u017f\u017fword", cuts=[303])
@hypothesis.example(text="github_pat_" + "Z9_Y8" * 60, cuts=[280])
@hypothesis.given(text=SHORT_TEXT, cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=4))
def test_a_stream_cut_anywhere_stores_no_secret_and_loses_no_other_text(text: str, cuts: list[int]) -> None:
    # Each delta the guard lets out is a row of its own (the strictest cut), redacted as stored.
    # Rows may be masked more than the whole (a row's edge is a word boundary to `\b`). An agent's
    # cut that starts a match the whole lacks (`é|Bearer sk-Bearer x`) makes it another text.
    cuts = [cut for cut in cuts if 0 < cut < len(text) and not starts_a_match_the_whole_lacks(text, cut)]
    bounds = sorted({0, len(text), *cuts})
    # Not covered (docs/security.md): a URL's password past the hold before its `@` goes out,
    # and of a secret past the hold only its own pattern's rest is dropped, not another's.
    # Nor the value an over-long one runs on into (`password=<300 characters>TOKEN: xyz`).
    hypothesis.assume(not a_long_secret_overlaps_another(text))
    hypothesis.assume(not a_long_value_runs_on_into_the_next(text))
    hypothesis.assume(all(len(head[1]) <= HOLD_CHARS for head in URL_CREDENTIALS.finditer(text)))
    guard = DeltaGuard()
    out = [event for a, b in pairwise(bounds) for event in guard.feed([delta(text[a:b])])]
    rows = [event.payload["delta"] for event in [*out, *guard.release()]]
    sent = "".join(rows)
    # Nothing is lost but what redaction replaces (the rest of a secret longer than the hold).
    assert plainly_redacted(sent) == plainly_redacted(text)
    # No secret runs across rows: what is stored is the whole text redacted, or more masked.
    stored = "".join(redact_text(row) for row in rows)
    assert masks_at_least(stored, plainly_redacted(text)), stored


URL_CREDENTIALS = re.compile(r"(?=(://[^\s:/@]+:[^\s@/]*))")  # a look-ahead: they may overlap


def a_long_secret_overlaps_another(text: str) -> bool:
    spans = sorted(span for pattern, _ in PATTERNS for span in secret_spans(pattern, 0, text))
    return any(
        end >= begin and max(end - start, end2 - begin) > HOLD_CHARS  # touching: a look-behind
        for (start, end), (begin, end2) in pairwise(spans)
    )


KEYWORD_ASSIGNMENT = next(p for p, _ in PATTERNS if isinstance(p, re.Pattern) and "password" in p.pattern)


def a_long_value_runs_on_into_the_next(text: str) -> bool:
    """A keyword's value longer than the hold that ended on another's assignment, and so ran on."""
    return any(
        match.end() - match.start() > HOLD_CHARS and re.search(r"[\s\"']", match["secret"])
        for match in KEYWORD_ASSIGNMENT.finditer(text)
    )


def masks_at_least(stored: str, expected: str) -> bool:
    """`stored` is `expected` with some spans (masked or not) replaced by REDACTED: no less masked."""
    pattern = ".*?".join(re.escape(part) for part in stored.split(REDACTED))
    return re.fullmatch(pattern, expected, re.DOTALL) is not None


@hypothesis.settings(max_examples=2000, derandomize=True, database=None, deadline=None)
@hypothesis.example(text="token=abcdefgh")
@hypothesis.given(text=st.lists(st.sampled_from([*FRAGMENTS, "a", "1", "k"]), max_size=6).map("".join))
def test_no_text_short_enough_for_the_guards_kept_cuts_holds_a_secret(text: str) -> None:
    # The guard keeps the cut of each short text it saw (redact_stream.short_cut_at): those texts
    # stay in memory, so none may be a secret.
    text = text[: redact_stream.SHORT_CHARS]
    assert plainly_redacted(text) == text
