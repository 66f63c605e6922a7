"""Runner labels: what a runner offers and what a project or an agent entry requires.

Design note: docs/runner.md ("Placement"). A label is a word (`gpu`) or a `key=value` pair
(`host=build-1`); a run needs every label its project and its agent entry require. Pure: read
by settings (the agent entries), the runner and the API.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}(=[A-Za-z0-9_./:@+-]{1,128})?")
MAX_LABELS = 32


class LabelError(ValueError):
    """A label list that is not `word` / `key=value` words."""


def parse_labels(raw: Any) -> tuple[str, ...]:
    """`"host=build-1,gpu"` or `["host=build-1", "gpu"]` → ("gpu", "host=build-1"): sorted, unique."""
    if isinstance(raw, str):
        raw = [part.strip() for part in raw.split(",") if part.strip()]
    if not isinstance(raw, list | tuple) or not all(isinstance(label, str) for label in raw):
        raise LabelError("expected a list of labels, or one string of comma-separated labels")
    for label in raw:
        if not LABEL.fullmatch(label):
            raise LabelError(f"{label!r} is not a label: a word or key=value (letters, digits, _ . -)")
    labels = tuple(sorted(set(raw)))
    if len(labels) > MAX_LABELS:
        raise LabelError(f"at most {MAX_LABELS} labels")
    return labels


def missing(required: Iterable[str], offered: Iterable[str]) -> list[str]:
    """The required labels a runner offering `offered` lacks (none: it may run the turn)."""
    have = set(offered)
    return sorted(label for label in set(required) if label not in have)


def under_roots(path: str, roots: Iterable[str]) -> bool:
    """Whether a project at `path` lies in one of a runner's roots (both absolute and resolved)."""
    for root in roots:
        root = root.rstrip("/")
        if path == root or path.startswith(root + "/"):
            return True
    return False
