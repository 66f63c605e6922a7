// Markdown in the browser, for text that is still streaming, with the server's rules
// (runs/markdown.py): the same parser settings, the same allow-list, images as links.
//
// Two layers, as on the server: markdown-it runs with raw HTML off (tags in the
// text come out escaped), then DOMPurify keeps only the server's tags, attributes
// and URL schemes. The page's CSP is the third. Nothing here ever calls innerHTML
// on a live document: DOMPurify parses into an inert one and hands back a fragment.
//
// Code blocks are highlighted with highlight.js (languages it knows only; no
// guessing) and its output goes through a second, stricter allow-list (spans with
// hljs-* classes) before it is shown.

import markdownit from '../vendor/markdown-it/markdown-it.min.js';
import createDOMPurify from '../vendor/dompurify/purify.es.js';
import hljs from '../vendor/highlight.js/highlight.min.js';
import { copyText, h } from './dom.js';

// ---------------------------------------------------------------- the server's rules

export const ALLOWED_TAGS = [
  'a', 'p', 'br', 'hr', 'blockquote', 'pre', 'code', 'em', 'strong', 'del', 's',
  'h1', 'h2', 'h3', 'h4', 'h5', 'h6', 'ul', 'ol', 'li',
  'table', 'thead', 'tbody', 'tr', 'th', 'td',
];
// Per tag, as nh3's `attributes` + `attribute_filter`.
const ATTRIBUTE_RULES = {
  a: { href: true, title: true, class: (v) => v === 'md-image' },
  code: { class: (v) => /^language-[A-Za-z0-9_+#.-]{1,40}$/.test(v) },
  ol: { start: (v) => /^[0-9]{1,9}$/.test(v) },
  th: { class: (v) => ALIGN_CLASSES.has(v) },
  td: { class: (v) => ALIGN_CLASSES.has(v) },
};
const ALIGN_CLASSES = new Set(['align-left', 'align-right', 'align-center']);
// http, https and mailto, and relative URLs (which nh3 also lets through); nothing else.
const SAFE_URL = /^(?:(?:https?|mailto):|[^a-z]|[a-z+.-]+(?:[^a-z+.\-:]|$))/i;
const LINK_REL = 'noopener noreferrer nofollow';

const purifier = createDOMPurify(window);
purifier.addHook('uponSanitizeAttribute', (node, data) => {
  const rule = ATTRIBUTE_RULES[node.nodeName.toLowerCase()]?.[data.attrName];
  if (!rule || (typeof rule === 'function' && !rule(data.attrValue))) data.keepAttr = false;
});
purifier.addHook('afterSanitizeAttributes', (node) => {
  if (node.nodeName === 'A') node.setAttribute('rel', LINK_REL);
});
const PURIFY_MARKDOWN = {
  ALLOWED_TAGS,
  ALLOWED_ATTR: ['href', 'title', 'class', 'start'],
  ALLOWED_URI_REGEXP: SAFE_URL,
  ALLOW_DATA_ATTR: false,
  ALLOW_ARIA_ATTR: false,
  ALLOW_UNKNOWN_PROTOCOLS: false,
  SAFE_FOR_TEMPLATES: false,
  RETURN_DOM_FRAGMENT: true,
};

// highlight.js's output: spans with hljs classes, and text.
const highlightPurifier = createDOMPurify(window);
highlightPurifier.addHook('uponSanitizeAttribute', (node, data) => {
  if (data.attrName !== 'class' || !/^(?:hljs-[\w-]+|[\w-]+_)(?: (?:hljs-[\w-]+|[\w-]+_))*$/.test(data.attrValue)) data.keepAttr = false;
});
const PURIFY_HIGHLIGHT = { ALLOWED_TAGS: ['span'], ALLOWED_ATTR: ['class'], RETURN_DOM_FRAGMENT: true };

function parser() {
  const md = markdownit('commonmark', { html: false, linkify: false, typographer: false });
  md.enable(['table', 'strikethrough']);
  const escape = md.utils.escapeHtml;
  // Images become links: a browser fetches an <img> on its own, an exfiltration channel.
  md.renderer.rules.image = (tokens, idx) => {
    const token = tokens[idx];
    const src = token.attrGet('src') || '';
    const alt = (token.children || []).map((child) => child.content).join('') || src;
    return `<a class="md-image" href="${escape(src)}">image: ${escape(alt)}</a>`;
  };
  // Alignment as a class: the CSP allows no inline style.
  const cell = (tokens, idx, options, env, self) => {
    const token = tokens[idx];
    const match = /^text-align:\s*(left|right|center)$/.exec(token.attrGet('style') || '');
    if (match) {
      token.attrs = (token.attrs || []).filter(([name]) => name !== 'style');
      token.attrSet('class', `align-${match[1]}`);
    }
    return self.renderToken(tokens, idx, options);
  };
  md.renderer.rules.th_open = cell;
  md.renderer.rules.td_open = cell;
  return md;
}

const md = parser();

// Sanitize HTML from any source with the server's allow-list; a DocumentFragment.
export function sanitize(html) {
  return purifier.sanitize(html, PURIFY_MARKDOWN);
}

// Markdown → a sanitized DocumentFragment (not yet decorated: no highlighting, no copy bars).
export function renderMarkdown(text) {
  return sanitize(text ? md.render(text) : '');
}

// ---------------------------------------------------------------- code blocks

export function languageOf(code) {
  return [...(code?.classList || [])].find((c) => c.startsWith('language-'))?.slice(9) || '';
}

// Highlight one <code> in place, if highlight.js knows its language.
export function highlight(code, language = languageOf(code)) {
  if (!code || !language || !hljs.getLanguage(language)) return false;
  const text = code.textContent;
  let html;
  try {
    html = hljs.highlight(text, { language, ignoreIllegals: true }).value;
  } catch {
    return false;
  }
  const fragment = highlightPurifier.sanitize(html, PURIFY_HIGHLIGHT);
  // Never show something other than the text: if the highlighter lost a character, keep it plain.
  if (fragment.textContent !== text) return false;
  code.replaceChildren(fragment);
  code.classList.add('hljs');
  return true;
}

function codeBlock(pre) {
  const code = pre.querySelector('code');
  const language = languageOf(code);
  highlight(code, language);
  const button = h('button', {
    type: 'button',
    class: 'copy-code',
    text: 'Copy',
    'aria-label': language ? `Copy ${language} code` : 'Copy code',
    onclick: async () => {
      const ok = await copyText((code || pre).textContent);
      button.textContent = ok ? 'Copied' : 'Copy failed';
      setTimeout(() => (button.textContent = 'Copy'), 1500);
    },
  });
  pre.tabIndex = 0; // a wide block scrolls sideways: reachable from the keyboard
  if (!pre.hasAttribute('aria-label')) pre.setAttribute('aria-label', language ? `${language} code` : 'Code');
  return h('div', { class: 'code-block' }, h('div', { class: 'code-bar' }, h('span', { class: 'code-lang', text: language }), button));
}

// Code blocks in rendered markdown get highlighting, a language tag and a copy button.
export function decorateCode(root) {
  for (const pre of root.querySelectorAll('pre')) {
    if (pre.parentElement?.classList.contains('code-block')) continue;
    const wrapper = codeBlock(pre);
    pre.replaceWith(wrapper);
    wrapper.append(pre);
  }
}

// ---------------------------------------------------------------- patching

// The sanitized, undecorated form of each shown top-level node, to compare new renders with.
const rawOf = new WeakMap();

function decorated(node) {
  const raw = node.cloneNode(true);
  let shown = node;
  if (node.nodeType === Node.ELEMENT_NODE) {
    if (node.nodeName === 'PRE') {
      shown = codeBlock(node);
      shown.append(node);
    } else {
      decorateCode(node);
    }
  }
  rawOf.set(shown, raw);
  return shown;
}

// Make `container` show `fragment`, touching only the top-level blocks from the first
// one that differs: earlier blocks (and a selection or an open code block in them) stay.
// Returns the number of blocks replaced.
export function patchBlocks(container, fragment) {
  const old = [...container.childNodes];
  const fresh = [...fragment.childNodes];
  let same = 0;
  while (same < old.length && same < fresh.length && (rawOf.get(old[same]) ?? old[same]).isEqualNode(fresh[same])) same++;
  if (same === old.length && same === fresh.length) return 0;
  for (const node of old.slice(same)) node.remove();
  container.append(...fresh.slice(same).map(decorated));
  return fresh.length - same;
}

// Show markdown rendered from `text` (live) in a container.
export function showMarkdown(container, text) {
  return patchBlocks(container, renderMarkdown(text));
}

// Make `container` show `fragment` after its first `keep` nodes, as patchBlocks does.
function patchFrom(container, keep, fragment) {
  const old = [...container.childNodes].slice(keep);
  const fresh = [...fragment.childNodes];
  let same = 0;
  while (same < old.length && same < fresh.length && (rawOf.get(old[same]) ?? old[same]).isEqualNode(fresh[same])) same++;
  for (const node of old.slice(same)) node.remove();
  container.append(...fresh.slice(same).map(decorated));
  return fresh.length - same;
}

// A line after which a new top-level block cannot belong to the block before it, whatever the
// text goes on with: not indented (code, a list item's body), not a list marker, quote or
// reference definition (a list, a quote, a lazy line could carry on across the blank line).
const FRESH_BLOCK_START = /^[^\s>*+\-0-9[|`~]/;
// Frozen nodes are moved into chunks of this many, each laid out only near the view (CSS
// content-visibility): a long answer's frame then lays out its last blocks, not all of them.
const CHUNK_NODES = 64;

// A streaming text's markdown, rendered in time bounded by its last blocks rather than all of
// it (issue 24: a long answer streaming at hundreds of deltas a second). The blocks before the
// last "stable" boundary (a blank line followed by a fresh block, outside any fence) are
// frozen: their nodes stay and their text is not parsed again. Link reference definitions seen
// so far carry over. The server's rendering laid over it when the turn settles is the final word.
export class LiveMarkdown {
  constructor(container) {
    this.container = container;
    this.text = '';
    this.frozenChars = 0; // text[0:frozenChars] is rendered into the first frozenNodes nodes
    this.frozenNodes = 0;
    this.references = {};
    this.renders = 0;
  }

  // How much of `text` the next show() parses again.
  unfrozen(text) {
    return text.length - this.frozenChars;
  }

  show(text) {
    const redrawn = this.container.childNodes.length < this.frozenNodes;
    if (redrawn || !text.startsWith(this.text.slice(0, this.frozenChars))) {
      // Not a continuation (a new text, or the container was redrawn): start over.
      this.frozenChars = this.frozenNodes = 0;
      this.references = {};
    }
    this.text = text;
    this.renders += 1;
    this.container.dataset.liveRenders = String(this.renders);
    const tail = text.slice(this.frozenChars);
    const env = { references: { ...this.references } };
    const tokens = tail ? md.parse(tail, env) : [];
    const cut = tail.includes('\r') ? 0 : stableCut(tail, tokens);
    const head = cut ? sanitize(md.renderer.render(tokens.slice(0, cut.index), md.options, env)) : null;
    const rest = sanitize(md.renderer.render(cut ? tokens.slice(cut.index) : tokens, md.options, env));
    const headCount = head ? head.childNodes.length : 0;
    if (head) head.append(rest);
    const changed = patchFrom(this.container, this.frozenNodes, head || rest);
    if (cut) {
      this.frozenNodes += headCount;
      this.frozenChars += cut.offset;
      this.references = env.references || {};
      this.chunk();
    }
    return changed;
  }

  // Wrap the frozen nodes not in a chunk yet in chunks of CHUNK_NODES (the rest waits for more).
  chunk() {
    const nodes = [...this.container.childNodes].slice(0, this.frozenNodes);
    let first = 0;
    while (first < nodes.length && nodes[first].classList?.contains('md-chunk')) first++;
    let chunks = first;
    for (; nodes.length - first >= CHUNK_NODES; first += CHUNK_NODES, chunks++) {
      const chunk = h('div', { class: 'md-chunk' });
      nodes[first].before(chunk);
      chunk.append(...nodes.slice(first, first + CHUNK_NODES));
    }
    this.frozenNodes = chunks + (nodes.length - first);
  }
}

// The last top-level block that starts a fresh block after a blank line: {index of its first
// token, offset of its first line in `text`}, or null. The block it starts stays live.
function stableCut(text, tokens) {
  let lines = null;
  for (let index = tokens.length - 1; index > 0; index--) {
    const token = tokens[index];
    if (token.level !== 0 || token.nesting === -1 || !token.map) continue;
    const line = token.map[0];
    if (line < 1) return null;
    lines ??= text.split('\n');
    if (lines[line - 1].trim() !== '' || !FRESH_BLOCK_START.test(lines[line])) continue;
    let offset = 0;
    for (let i = 0; i < line; i++) offset += lines[i].length + 1;
    return { index, offset };
  }
  return null;
}

// Show the HTML the server rendered for a settled turn (read from an inert document);
// it is sanitized here again all the same. Blocks equal to the live render stay as they are.
export function showServerHtml(container, html) {
  // A long live text's frozen blocks sit in chunks (LiveMarkdown): back to the flat list the
  // server's HTML is, so that equal blocks are kept.
  for (const chunk of container.querySelectorAll(':scope > .md-chunk')) chunk.replaceWith(...chunk.childNodes);
  return patchBlocks(container, sanitize(html));
}
