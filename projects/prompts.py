"""Workflow prompt templates: `str.format` syntax, with limits so rendering stays bounded.

`{x:>3000000000}` passed validation and was formatted at once (MemoryError, or gigabytes),
and a template may repeat a 100 KB variable thousands of times. So: every number in a format
spec is at most MAX_SPEC_NUMBER, specs may not nest fields (`{x:>{width}}` takes the width
from launch input), and rendering stops once the prompt passes MAX_PROMPT_CHARS.
"""

from __future__ import annotations

import re
import string

from projects.refusals import Refused

# Width and precision (and any other number in a spec) at most this.
MAX_SPEC_NUMBER = 1000
# A rendered prompt is a message: the same limit as a composer's text (runs.schemas.MessageText).
MAX_PROMPT_CHARS = 1_000_000

_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NUMBER = re.compile(r"\d+")


class TemplateLimit(Refused, ValueError):
    """A template or a rendering past a limit: `code` is the API's error code (422)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(422, code, message)


def _check_spec(name: str, spec: str) -> None:
    if "{" in spec or "}" in spec:
        raise ValueError(f"field {name!r}: a format spec may not contain another field")
    for number in _NUMBER.findall(spec):
        if len(number) > 4 or int(number) > MAX_SPEC_NUMBER:
            raise TemplateLimit(
                "template_spec_too_large",
                f"field {name!r}: widths and precisions may be at most {MAX_SPEC_NUMBER}, got {number[:20]}",
            )


def parse_template(template: str) -> list[tuple[str, str | None, str, str | None]]:
    """The template's parts, checked: ValueError for a bad field or spec, TemplateLimit past a limit."""
    parts = list(string.Formatter().parse(template))
    for _, name, spec, _ in parts:
        if name is None:
            continue
        if not _FIELD.match(name):
            raise ValueError(f"template field {name!r} is not a plain variable name")
        _check_spec(name, spec or "")
    return parts


def template_variables(template: str) -> list[str]:
    """The `{names}` the template expects, in order of first use."""
    names: list[str] = []
    for _, name, _, _ in string.Formatter().parse(template):
        if name is not None and name not in names:
            names.append(name)
    return names


def render_template(template: str, variables: dict[str, str]) -> str:
    """Substitute variables; KeyError naming missing ones, ValueError for a bad template,
    TemplateLimit (`prompt_too_large`) once the prompt passes MAX_PROMPT_CHARS."""
    parts = parse_template(template)
    missing = [name for name in template_variables(template) if name not in variables]
    if missing:
        raise KeyError(", ".join(missing))
    formatter = string.Formatter()
    pieces: list[str] = []
    size = 0
    for literal, name, spec, conversion in parts:
        pieces.append(literal)
        size += len(literal)
        if name is not None:
            value = formatter.convert_field(str(variables[name]), conversion)
            piece = format(value, spec or "")
            pieces.append(piece)
            size += len(piece)
        # Checked piece by piece: a piece is at most a variable's (bounded) size.
        if size > MAX_PROMPT_CHARS:
            raise TemplateLimit(
                "prompt_too_large", f"The rendered prompt would exceed {MAX_PROMPT_CHARS} characters."
            )
    return "".join(pieces)
