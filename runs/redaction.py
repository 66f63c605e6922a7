"""Secrets never reach the journal: payloads are scrubbed before they are written.

Two layers: values under secret-looking keys are replaced whole, and secret
shapes inside any string (API keys, bearer tokens, `password=…`) are masked.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any, Protocol

REDACTED = "[REDACTED]"

# Normalised key names (lower case, no `-`/`_`) whose values are secrets. Exact
# names or suffixes: "token" alone is a secret, "input_tokens" is usage.
_SECRET_KEYS = {
    "apikey", "token", "accesstoken", "refreshtoken", "authtoken", "idtoken", "sessiontoken", "secret",
    "clientsecret", "secretkey", "password", "passwd", "pwd", "passphrase", "authorization",
    "credentials", "privatekey", "cookie", "setcookie", "xapikey",
}  # fmt: skip
_SECRET_SUFFIXES = ("apikey", "password", "secret", "accesstoken", "authtoken", "privatekey", "passphrase")


class _Substituter(Protocol):
    def sub(self, repl: Any, string: str) -> str: ...


class _PrivateKeyBlocks:
    """PEM private key blocks, header to the first footer after it, found in linear time.

    A lazy regex from header to footer rescanned to the end of the text from every header that
    has no footer after it: quadratic in a text of headers. A header without a later
    footer means no later header has one either, so the scan stops there.
    """

    _begin = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")
    _end = re.compile(r"-----END [A-Z ]*PRIVATE KEY-----")

    def sub(self, repl: str, string: str) -> str:
        parts: list[str] = []
        pos = 0
        while (begin := self._begin.search(string, pos)) is not None:
            end = self._end.search(string, begin.end())
            if end is None:
                break
            parts += [string[pos : begin.start()], repl]
            pos = end.end()
        if not parts:
            return string
        parts.append(string[pos:])
        return "".join(parts)


# Every pattern runs in time linear in the text (tests/test_security_redaction.py feeds each
# 1 MiB of adversarial input). Python's `re` backtracks, so no pattern may start with an
# unbounded run that many start positions share (`\b[a-z.]*keyword` took 18 s on 16 KB of
# "a."): matches are anchored on a literal, and what precedes it is left in place unmatched.
_PATTERNS: list[tuple[_Substituter, str | Any]] = [
    # Authorization headers and bearer tokens.
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), lambda m: f"{m.group(1)} {REDACTED}"),
    # Well-known key shapes: OpenAI/Anthropic, GitHub, Slack, AWS, Google, Hugging Face, our own.
    (re.compile(r"\b(sk|rk|pk)-(?:ant-|proj-|live-|test-)?[A-Za-z0-9_-]{16,}"), REDACTED),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), REDACTED),
    (re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"), REDACTED),
    (re.compile(r"\bxox[abprs]-[A-Za-z0-9-]{10,}"), REDACTED),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), REDACTED),
    (re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b"), REDACTED),
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), REDACTED),
    (re.compile(r"\bhw_[A-Za-z0-9_-]{30,}"), REDACTED),
    (_PrivateKeyBlocks(), REDACTED),
    # key=value / key: value assignments of password-like names, in shell, env files, YAML, JSON
    # text. The match starts at the keyword: a prefix (`OPENAI_` in `OPENAI_API_KEY=`) is kept as
    # it is, never matched, which is what keeps the pattern linear.
    (
        re.compile(
            r"(?i)(?P<key>(?:api[_-]?key|password|passwd|secret|token|private[_-]?key)\b"
            r"[\"']?\s*[:=]\s*)(?P<quote>[\"']?)(?P<value>[^\s\"',;]{4,})"
        ),
        lambda m: f"{m.group('key')}{m.group('quote')}{REDACTED}",
    ),
    # Credentials embedded in URLs: scheme://user:pass@host. Anchored on `://` after a scheme
    # character, for the same reason: the scheme itself is left in place.
    (
        re.compile(r"(?<=[A-Za-z0-9+.-])(?P<head>://[^\s:/@]+:)[^\s@/]+@"),
        lambda m: f"{m.group('head')}{REDACTED}@",
    ),
]


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
assert len(_TRIGGERS) == len(_PATTERNS)


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
    low = _fold(text)
    for (pattern, replacement), trigger in zip(_PATTERNS, _TRIGGERS, strict=True):
        if trigger(text, low):
            masked = pattern.sub(replacement, text)  # type: ignore[arg-type]
            if masked != text:
                text, low = masked, _fold(masked)
    return text


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
