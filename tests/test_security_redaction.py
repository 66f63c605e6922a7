"""Redaction runs in time linear in its input: no text stalls the runner's writer thread.

User text (steers, clarify answers up to 1 MiB) goes through every pattern. The old
`key=value` pattern took 18 s on 16 KB of "a." repeated; each input below is built to make
one pattern backtrack, at 1 MiB.
"""

from __future__ import annotations

import gc
import re
import time

import pytest

from runs.redaction import KEYWORD, KEYWORDS, PATTERNS, REDACTED, redact_text

MIB = 1024 * 1024


def mib(unit: str, tail: str = "") -> str:
    return unit * ((MIB - len(tail)) // len(unit)) + tail


# For each pattern, in PATTERNS order, texts that make a backtracking form of it quadratic.
ADVERSARIAL: dict[str, list[str]] = {
    "bearer": [mib("bearer "), mib("Basic\t"), "bearer" + mib(" ", "!")],
    "sk": [mib("sk-"), mib("sk-aaaaaaaaaaaaaaa ")],
    "github": [mib("ghp_"), mib("ghp_a")],
    "github_pat": [mib("github_pat_"), mib("github_pat_a-")],
    "slack": [mib("xoxb-"), mib("xoxb-a ")],
    "aws": [mib("AKIA"), mib("AKIA-")],
    "google": [mib("AIza"), mib("AIza-")],
    "huggingface": [mib("hf_"), mib("hf_a.")],
    "hermesweb": [mib("hw_"), mib("hw_a.")],
    "private_key": [
        mib("-----BEGIN RSA PRIVATE KEY-----\n"),
        "-----BEGIN " + mib("A "),
        mib("-----BEGIN PRIVATE KEY-----\n-----END RSA KEY-----\n"),
    ],
    "key_value": [
        mib("a.", "token="),
        mib("a-", "password: x"),
        mib("password "),
        "password=" + mib(" ", "!"),
        mib("x.api_key", "="),
        mib("token: "),  # one value running on through every assignment it ends on
        mib("password=abcdtoken: ab "),  # a run-on that fails each time, after its lookbehind
        mib("token:\t", "a"),
    ],
    "url_credentials": [mib("a.", "://@"), mib("a://", "@"), mib("a://b:", "@"), mib("x+", "://u:p")],
}
assert len(ADVERSARIAL) == len(PATTERNS)


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_every_pattern_scrubs_a_mebibyte_of_adversarial_text_in_linear_time(name: str) -> None:
    for text in ADVERSARIAL[name]:
        assert len(text) >= MIB - 64
        elapsed = cpu_seconds_to_redact(text)
        # A linear pass over 1 MiB takes 10-100 ms here; a quadratic form (18 s on 16 KB) would
        # take hours. The bound leaves a loaded test worker 20 times the slowest linear pass.
        assert elapsed < 2, f"{name}: {elapsed:.2f} s on {text[:40]!r}…"


def cpu_seconds_to_redact(text: str) -> float:
    # CPU time of this thread, not wall time: a busy machine must not fail the test. Nor may a
    # full collection of a long-lived test worker's heap, which the matches' allocations can start
    # (a 30 ms pass once measured 0.57 s late in a loaded run).
    gc.disable()
    try:
        started = time.thread_time()
        redact_text(text)
        return time.thread_time() - started
    finally:
        gc.enable()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("export OPENAI_API_KEY=sk-nothere", f"export OPENAI_API_KEY={REDACTED}"),
        ("my.service.token: abcd1234", f"my.service.token: {REDACTED}"),
        ('{"db_password": "hunter22"}', f'{{"db_password": "{REDACTED}"}}'),
        ("HTTPS://app:s3cret@db.internal/x", f"HTTPS://app:{REDACTED}@db.internal/x"),
        ("git+ssh://me:pw12@host", f"git+ssh://me:{REDACTED}@host"),
    ],
)
def test_the_anchored_patterns_still_mask_what_the_prefixed_ones_did(text: str, expected: str) -> None:
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("secret: token: abcdef12", f"secret: {REDACTED}"),
        ("TOKEN: abcdTOKEN: xyz12345 later", f"TOKEN: {REDACTED} later"),
        ("password=hunter2Api-Key= 'xyz12345' x", f"password={REDACTED}' x"),
        ("password=hunter2token: ab", f"password={REDACTED} ab"),  # too short to be a value
        ("token=YWJjZA== and more", f"token={REDACTED} and more"),  # `=` ends no assignment
    ],
)
def test_a_value_that_took_the_next_keyword_runs_on_into_its_value(text: str, expected: str) -> None:
    # Matches do not overlap: the second assignment would be missed, its value left in clear.
    assert redact_text(text) == expected


def test_the_keyword_regex_spells_exactly_the_keyword_list() -> None:
    # The regex varies only at a separator: every spelling of each word with `_`, `-` or none.
    spellings = {
        word.replace(sep, other) for word in KEYWORDS for sep in "_-" for other in ("", "_", "-")
    } | {word.replace(sep, "") for word in KEYWORDS for sep in "_-"}
    assert {word for word in spellings if re.fullmatch(KEYWORD, word)} == set(KEYWORDS)


def test_a_private_key_block_is_masked_from_its_first_header_to_the_first_footer_after_it() -> None:
    block = "-----BEGIN RSA PRIVATE KEY-----\nMIIabc\n-----END RSA PRIVATE KEY-----"
    orphan = "-----BEGIN PRIVATE KEY-----\n"
    text = f"a {orphan}{block} b {block} c {orphan}no footer"

    assert redact_text(text) == f"a {REDACTED} b {REDACTED} c {orphan}no footer"


def test_text_without_secret_shapes_is_returned_unchanged() -> None:
    text = "see https://example.org/a:b@c and the token count: 12; password reset docs"
    assert redact_text(text) == text
