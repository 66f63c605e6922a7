"""Redaction's rule with no shortcut, for tests to hold runs/redaction.py's shortcuts to."""

from __future__ import annotations

from runs.redaction import PATTERNS, REDACTED, secret_spans


def plainly_redacted(text: str) -> str:
    """Every pattern on the whole text, no trigger, no fold, no kept set: each secret found masked,
    secrets that overlap or touch as one."""
    spans = sorted(span for pattern, group in PATTERNS for span in secret_spans(pattern, group, text))
    out: list[str] = []
    pos = 0
    for start, end in spans:
        if out and start <= pos:  # overlaps or touches the secret just masked
            pos = max(pos, end)
            continue
        out += [text[pos:start], REDACTED]
        pos = end
    return "".join([*out, text[pos:]])
