"""Secrets never reach the journal: payloads are scrubbed before they are written.

Two layers: values under secret-looking keys are replaced whole, and secret
shapes inside any string (API keys, bearer tokens, `password=…`) are masked.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator
from functools import lru_cache
from typing import Any

REDACTED = "[REDACTED]"

# Normalised key names (lower case, no `-`/`_`) whose values are secrets. Exact
# names or suffixes: "token" alone is a secret, "input_tokens" is usage.
_SECRET_KEYS = {
    "apikey", "token", "accesstoken", "refreshtoken", "authtoken", "idtoken", "sessiontoken", "secret",
    "clientsecret", "secretkey", "password", "passwd", "pwd", "passphrase", "authorization",
    "credentials", "privatekey", "cookie", "setcookie", "xapikey",
}  # fmt: skip
_SECRET_SUFFIXES = ("apikey", "password", "secret", "accesstoken", "authtoken", "privatekey", "passphrase")


class _PrivateKeyBlocks:
    """PEM private key blocks, header to the first footer after it, found in linear time.

    A lazy regex from header to footer rescanned to the end of the text from every header that
    has no footer after it: quadratic in a text of headers. A header without a later
    footer means no later header has one either, so the scan stops there.
    """

    _begin = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")
    _end = re.compile(r"-----END [A-Z ]*PRIVATE KEY-----")

    def spans(self, string: str, pos: int = 0) -> Iterator[tuple[int, int]]:
        """(start, end) of each block from `pos` on."""
        while (begin := self._begin.search(string, pos)) is not None:
            end = self._end.search(string, begin.end())
            if end is None:
                return
            yield begin.start(), end.end()
            pos = end.end()

    def open_at(self, string: str) -> int | None:
        """Where the first header after the last footer begins: one no footer closes.

        Every header before the last footer is closed by it or an earlier one. Found from the
        end (a stream asks this for every piece while it holds up to 16 KiB of a block).
        """
        pos = len(string)
        while (pos := string.rfind("-----END ", 0, pos)) >= 0:
            if (end := self._end.match(string, pos)) is not None:
                begin = self._begin.search(string, end.end())
                return None if begin is None else begin.start()
        begin = self._begin.search(string)
        return None if begin is None else begin.start()


KEYWORDS = (
    "api_key", "api-key", "apikey", "password", "passwd", "secret", "token",
    "private_key", "private-key", "privatekey",
)  # fmt: skip
# KEYWORDS as one regex, in the form `re` scans fastest (an alternation of all ten: 1.5 times the time
# on prose); tests/test_security_redaction.py holds the two equal.
KEYWORD = r"api[_-]?key|password|passwd|secret|token|private[_-]?key"
_VALUE = r"""[^\s"',;]{4,}"""
# Behind the end of a value that took a keyword and its separator (fixed widths, as `re` asks).
_ENDS_ASSIGNING = "(?:" + "|".join(f"(?<={re.escape(word)}[:=])" for word in KEYWORDS) + ")"


# Every pattern runs in time linear in the text (tests/test_security_redaction.py feeds each
# 1 MiB of adversarial input). Python's `re` backtracks, so no pattern may start with an
# unbounded run that many start positions share (`\b[a-z.]*keyword` took 18 s on 16 KB of
# "a."): matches are anchored on a literal, and what precedes it is left in place unmatched.
# Each with the group of its match that is the secret (0: all of it); what is around it (a
# header's scheme, a keyword, a URL's user) stays in place.
PATTERNS: list[tuple[re.Pattern[str] | _PrivateKeyBlocks, int | str]] = [
    # Authorization headers and bearer tokens.
    (re.compile(r"(?i)\b(?:bearer|basic)\s+(?P<secret>[A-Za-z0-9._~+/=-]{8,})"), "secret"),
    # Well-known key shapes: OpenAI/Anthropic, GitHub, Slack, AWS, Google, Hugging Face, our own.
    (re.compile(r"\b(sk|rk|pk)-(?:ant-|proj-|live-|test-)?[A-Za-z0-9_-]{16,}"), 0),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), 0),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"), 0),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"), 0),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), 0),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b"), 0),
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), 0),
    (re.compile(r"\bhw_[A-Za-z0-9_-]{30,}"), 0),
    (_PRIVATE_KEYS := _PrivateKeyBlocks(), 0),
    # key=value / key: value assignments of password-like names, in shell, env files, YAML, JSON
    # text. The match starts at the keyword: a prefix (`OPENAI_` in `OPENAI_API_KEY=`) is kept as
    # it is, never matched, which is what keeps the pattern linear. A value that ends on another
    # assignment (`secret: token: x…`, `password=abcTOKEN: x…`) took that keyword, so it goes
    # on to that assignment's value: matches do not overlap, and the second would be missed.
    (
        re.compile(
            rf"(?i)(?:{KEYWORD})\b"
            rf"[\"']?\s*[:=]\s*[\"']?(?P<secret>{_VALUE}(?:{_ENDS_ASSIGNING}\s*[\"']?{_VALUE})*)"
        ),
        "secret",
    ),
    # Credentials embedded in URLs: scheme://user:pass@host. Anchored on `://` after a scheme
    # character, for the same reason: the scheme itself is left in place.
    (re.compile(r"(?<=[A-Za-z0-9+.-])://[^\s:/@]+:(?P<secret>[^\s@/]+)@"), "secret"),
]


def secret_spans(
    pattern: re.Pattern[str] | _PrivateKeyBlocks, group: int | str, text: str
) -> Iterator[tuple[int, int]]:
    """Where in `text` the secrets `pattern` finds are (its matches' `group`)."""
    if isinstance(pattern, re.Pattern):
        return (match.span(group) for match in pattern.finditer(text))
    return pattern.spans(text)


def masked(text: str, spans: Iterable[tuple[int, int]]) -> str:
    """`text` with each run of overlapping or touching `spans` replaced by one REDACTED."""
    runs: list[list[int]] = []
    for start, end in sorted(spans):
        if runs and start <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], end)
        else:
            runs.append([start, end])
    parts: list[str] = []
    pos = 0
    for start, end in runs:
        parts += [text[pos:start], REDACTED]
        pos = end
    parts.append(text[pos:])
    return "".join(parts)


# For each pattern above, in order, a substring test that any match of it implies. `\b` defeats
# the regex engine's literal-prefix scan, so every pattern costs a full pass; these tests
# cost far less and skip the pass when it cannot match. They see
# the text folded by `_fold` (see there), in which every IGNORECASE match of an ASCII
# keyword appears as that keyword in lower case.
_TRIGGERS: list[Callable[[str, str], bool]] = [
    lambda text, low: "bearer" in low or "basic" in low,
    lambda text, low: "k-" in text,
    lambda text, low: any(prefix in text for prefix in ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")),
    lambda text, low: "github_pat_" in text,
    lambda text, low: "xox" in text,
    lambda text, low: "AKIA" in text,
    lambda text, low: "AIza" in text,
    lambda text, low: "hf_" in text,
    lambda text, low: "hw_" in text,
    lambda text, low: "PRIVATE KEY-----" in text,
    lambda text, low: (
        ("=" in text or ":" in text)
        and any(word in low for word in ("api", "password", "passwd", "secret", "token", "private"))
    ),
    lambda text, low: "://" in text and "@" in text,
]
assert len(_TRIGGERS) == len(PATTERNS)


@lru_cache(maxsize=4096)
def _is_secret_key(key: str) -> bool:
    normal = key.lower().replace("_", "").replace("-", "")
    return normal in _SECRET_KEYS or normal.endswith(_SECRET_SUFFIXES)


def redact_text(text: str) -> str:
    short = len(text) <= _KNOWN_CLEAN_CHARS
    if short and text in _known_clean:
        return text
    masked = _redact_text(text)
    if short and masked == text:
        if len(_known_clean) >= _KNOWN_CLEAN_MAX:
            _known_clean.clear()
        _known_clean.add(text)
    return masked


# Short strings recur all the time (statuses, ids, kinds, common tokens), so the ones found
# clean are remembered. Only clean ones: no secret is kept in memory longer than its payload.
_KNOWN_CLEAN_CHARS = 64
_KNOWN_CLEAN_MAX = 16384
_known_clean: set[str] = set()


# Under IGNORECASE an ASCII letter also matches four non-ASCII ones (the `re` documentation:
# U+0130 and U+0131, dotted and dotless i; U+017F, long s; U+212A, the Kelvin sign). Folding
# those to the letter they match keeps every such match visible to the triggers.
_FOLD_TO_ASCII = str.maketrans({"\u0130": "i", "\u0131": "i", "\u017f": "s", "\u212a": "k"})


def _fold(text: str) -> str:
    """What the IGNORECASE triggers search: lower-case ASCII in which every match shows."""
    if text.isascii():
        return text.lower()
    if any(char in text for char in "\u0130\u0131\u017f\u212a"):
        text = text.translate(_FOLD_TO_ASCII)
    # Only ASCII letters spell an ASCII keyword, so dropping every other character keeps each
    # such run whole (joining runs only costs a needless pass). Unicode lower() and a regex
    # scan each cost ~8 µs per KiB of streamed text; this, ~2.
    return text.encode("ascii", "ignore").decode("ascii").lower()


def _redact_text(text: str) -> str:
    # Every pattern reads the text as it came, and every secret any of them finds is masked:
    # a pattern's match never hides another's (`Bearer sk-TOKEN: x…` masks both tokens).
    low = _fold(text)
    spans = [
        span
        for (pattern, group), trigger in zip(PATTERNS, _TRIGGERS, strict=True)
        if trigger(text, low)
        for span in secret_spans(pattern, group, text)
    ]
    return masked(text, spans) if spans else text


def redact(value: Any) -> Any:
    """Return a copy of a JSON-like value with secrets masked."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            if (
                isinstance(key, str)
                and _is_secret_key(key)
                and isinstance(item, (str, int, float))
                and item != ""
            ):
                out[key] = REDACTED
            else:
                out[key] = redact(item)
        return out
    if isinstance(value, (list, tuple)):
        return [redact(item) for item in value]
    return value


# ------------------------------------------------------------------ text that arrives in pieces
# A secret split across two streamed pieces (token deltas) is in no single journal row whole.
# runs/runner/redact_stream.py holds back the tail of a stream that could still grow into a
# secret; these say which tail that is, from the patterns above.

HOLD_CHARS = 256  # the longest tail held back for the patterns above, PEM blocks aside
PEM_HOLD_CHARS = 16 * 1024  # a private key block, header to footer (RSA 8192: ~6.5 KB)


def _prefixes(word: str) -> str:
    """A regex matching every non-empty prefix of `word`: `a(?:b(?:c)?)?`."""
    out = ""
    for char in reversed(word[1:]):
        out = f"(?:{re.escape(char)}{out})?"
    return re.escape(word[0]) + out


def _opening(*words: str, then: str = "") -> str:
    """A prefix of one of `words`, or a whole one followed by `then`."""
    alternatives = [_prefixes(word) for word in words]
    if then:
        alternatives.append(f"(?:{'|'.join(map(re.escape, words))}){then}")
    return "|".join(alternatives)


# A suffix of a text that is a prefix of a match of one of the patterns above, or a match that
# further text could lengthen; each alternative ends the text (`\Z`), so a search gives the
# leftmost such suffix. One per pattern, in the same order; every prefix of every match is one.
_OPENINGS = [
    rf"(?i:\b(?:{_opening('bearer', 'basic', then=r'\s+[A-Za-z0-9._~+/=-]*')}))",
    rf"\b(?:{_opening('sk-', 'rk-', 'pk-', then='[A-Za-z0-9_-]*')})",
    rf"\b(?:{_opening('ghp_', 'gho_', 'ghu_', 'ghs_', 'ghr_', then='[A-Za-z0-9]*')})",
    rf"\b(?:{_opening('github_pat_', then='[A-Za-z0-9_]*')})",
    rf"\b(?:{_opening('xoxa-', 'xoxb-', 'xoxp-', 'xoxr-', 'xoxs-', then='[A-Za-z0-9-]*')})",
    rf"\b(?:{_opening('AKIA', then='[0-9A-Z]{0,16}')})",
    rf"\b(?:{_opening('AIza', then='[0-9A-Za-z_-]{0,35}')})",
    rf"\b(?:{_opening('hf_', then='[A-Za-z0-9]*')})",
    rf"\b(?:{_opening('hw_', then='[A-Za-z0-9_-]*')})",
    # A header under way; a whole header without its footer is `open_private_key`'s.
    rf"(?:{_opening('-----BEGIN ', then=r'[A-Z ]*-{0,4}')})",
    rf"(?i:{_opening(*KEYWORDS, then=r'''["']?\s*(?:[:=]\s*["']?[^\s"',;]*)?''')})",
    # From the scheme's last character, which the pattern's look-behind needs to see.
    r"[A-Za-z0-9+.-](?::(?:/(?:/(?:[^\s:/@]+(?::[^\s@/]*)?)?)?)?)",
]
assert len(_OPENINGS) == len(PATTERNS)
OPENING = re.compile("|".join(f"(?:{opening})\\Z" for opening in _OPENINGS))

# For each pattern, the characters that lengthen a match of it that ends a text (None: its
# matches end on a fixed character or length): what a stream drops after a secret it had to
# let go of before its end.
_LENGTHENING: list[re.Pattern[str] | None] = [
    re.compile(r"(?i)[A-Za-z0-9._~+/=-]*"),  # IGNORECASE as its pattern (U+017F is an `s`)
    re.compile(r"[A-Za-z0-9_-]*"),
    re.compile(r"[A-Za-z0-9]*"),
    re.compile(r"[A-Za-z0-9_]*"),
    re.compile(r"[A-Za-z0-9-]*"),
    None,
    None,
    re.compile(r"[A-Za-z0-9]*"),
    re.compile(r"[A-Za-z0-9_-]*"),
    None,
    re.compile(r"""[^\s"',;]*"""),
    None,
]
assert len(_LENGTHENING) == len(PATTERNS)


# Every opening longer than _OPENING_TAIL characters holds one of these whole (folded as
# `_fold` does; a URL's past 12 characters holds `://`); shorter ones lie in the text's last
# _OPENING_TAIL characters. Searching those alone when none is present costs a small part of a
# full search (~0.5 µs a character).
_OPENING_WORDS = (
    "bearer", "basic", "sk-", "rk-", "pk-", "gh", "github", "xox", "akia", "aiza", "hf_", "hw_",
    "-----begin ", "api", "passw", "secret", "token", "private", "://",
)  # fmt: skip
_OPENING_TAIL = 12

# Where an opening may begin: the first character of a word of every alternative of OPENING but
# the last (U+017F, long s, is an `s` to IGNORECASE), and a scheme's character before a `:`.
# `re` tries all of OPENING at every position; this finds the few worth trying (tests hold
# opening_start to a plain OPENING.search).
_OPENING_CANDIDATE = re.compile(r"[abghprstxABPST\-\u017f]|[A-Za-z0-9+.-](?=:)")


def opening_start(text: str, start: int = 0) -> int | None:
    """Where the leftmost suffix of `text` from `start` on that could grow into a secret begins."""
    tail = len(text) - _OPENING_TAIL
    if tail > start:
        low = _fold(text[start:])  # whole: a word begun before `tail` may end after it
        if not any(word in low for word in _OPENING_WORDS):
            start = tail
    for candidate in _OPENING_CANDIDATE.finditer(text, start):
        if OPENING.match(text, candidate.start()) is not None:
            return candidate.start()
    return None


def open_private_key(text: str) -> int | None:
    """Where the last private key header of `text` without a footer after it begins."""
    return _PRIVATE_KEYS.open_at(text) if "PRIVATE KEY-----" in text else None


def secret_at_end(text: str) -> re.Pattern[str] | None:
    """If a secret ends `text` and more text could lengthen it: what lengthens it."""
    low = _fold(text)
    for (pattern, _), trigger, lengthening in zip(PATTERNS, _TRIGGERS, _LENGTHENING, strict=True):
        if lengthening is None or not trigger(text, low):
            continue
        assert isinstance(pattern, re.Pattern)
        ends = [match.end() for match in pattern.finditer(text)]
        if ends and ends[-1] == len(text):
            return lengthening
    return None


# For each pattern, how many characters before its match its look-behind reads (the URL's scheme).
_READS_BEFORE = [1 if isinstance(p, re.Pattern) and p.pattern.startswith("(?<=") else 0 for p, _ in PATTERNS]


def match_across(text: str, cut: int, start: int = 0) -> int | None:
    """Where the leftmost match that a cut at `cut` would split, begun in `text[start:cut]`, begins.

    A cut at the leftmost opening can still fall inside a match that has ended already
    (`password=hunter2secret ` opens again at `secret `). A match also needs what its assertions
    read beside it: one ending at the cut may end on `\b` (an `AIza` key ending in `-`), and the
    URL pattern's look-behind reads the character before it; a row's edge would change both.
    """
    piece = text[start:]
    low = _fold(piece)
    found: int | None = None
    for (pattern, _), trigger, before in zip(PATTERNS, _TRIGGERS, _READS_BEFORE, strict=True):
        if not trigger(piece, low):
            continue
        if isinstance(pattern, re.Pattern):
            matches = pattern.finditer(text, start, cut + HOLD_CHARS)
            spans: Iterable[tuple[int, int]] = (match.span() for match in matches)
        else:
            spans = _PRIVATE_KEYS.spans(text, start)
        for begin, end in spans:
            begin = max(0, begin - before)
            if begin >= cut or (found is not None and begin >= found):
                break
            if end >= cut:
                found = begin
                break
    return found


class RedactingLogFilter(logging.Filter):
    """Masks secrets in every log record before a handler writes it (settings.LOGGING).

    Log lines quote what failed: an agent's refusal, a request's error, a traceback's message.
    Any of those may carry a token the agent echoed, so the handler sees only the masked text.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            return True  # a malformed record is logging's own error to report
        masked = redact_text(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info)
        return True
