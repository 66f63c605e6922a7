// Search across everything in the user's sessions (GET /api/search; docs/search.md).
//
// The sidebar's search box filters session titles as it is typed (sidebar.js). The same words
// also search the prompts, answers and tool titles of every settled turn: the hits are listed
// under the sessions ("In messages"), and each opens its session scrolled to the turn
// (`/sessions/<id>/#run-<run id>`, SessionController.revealRun). Keys: Enter searches at once,
// ↓ from the box goes to the hits, ↑/↓ move between them, Esc goes back to the box.

import { api, NetworkError } from './api.js';
import { h } from './dom.js';
import { sessionTitle } from './sidebar.js';

const DEBOUNCE_MS = 250;
const MIN_CHARS = 2;
const MAX_CHARS = 200; // runs/search.py QUERY_MAX

// The server escaped every character of the snippet and added only <mark>: it is rebuilt here as
// text nodes and <mark> elements, so nothing in it is ever parsed as markup.
const ENTITIES = { '&amp;': '&', '&lt;': '<', '&gt;': '>', '&quot;': '"', '&#x27;': "'" };

export function snippetNodes(snippet) {
  const nodes = [];
  let marked = false;
  for (const part of String(snippet || '').split(/(<mark>|<\/mark>)/)) {
    if (part === '<mark>') marked = true;
    else if (part === '</mark>') marked = false;
    else if (part) {
      const text = part.replace(/&(?:amp|lt|gt|quot|#x27);/g, (entity) => ENTITIES[entity]);
      nodes.push(marked ? h('mark', { text }) : document.createTextNode(text));
    }
  }
  return nodes;
}

function when(iso) {
  const date = new Date(iso);
  const sameYear = date.getFullYear() === new Date().getFullYear();
  return date.toLocaleDateString(undefined, { month: 'short', day: 'numeric', year: sameYear ? undefined : 'numeric' });
}

export class SearchPanel {
  // `onOpen(sessionId, runId)`: true when the page showed the hit itself (its session is open).
  constructor(input, el, { onOpen }) {
    this.input = input;
    this.el = el;
    this.onOpen = onOpen;
    this.timer = null;
    this.ticket = 0;
    this.query = '';
    this.hits = [];
    this.page = 1;
    this.total = 0;
    this.hasNext = false;
    // Built once and then updated: a status region announces changes only while it stays.
    const head = `${el.id}-head`;
    this.statusEl = h('p', { class: 'search-status', role: 'status' });
    this.listEl = h('ul', { class: 'search-hits', 'aria-labelledby': head, hidden: true });
    this.moreEl = h('button', { type: 'button', class: 'btn link small search-more', text: 'More results', hidden: true, onclick: () => this.search({ more: true }) });
    el.replaceChildren(h('div', { class: 'section-label', id: head, text: 'In messages' }), this.statusEl, this.listEl, this.moreEl);
    input.setAttribute('aria-controls', el.id);
    input.addEventListener('input', () => this.schedule());
    input.addEventListener('keydown', (event) => {
      if (event.key === 'Enter') {
        event.preventDefault();
        this.search({ again: true });
      } else if (event.key === 'ArrowDown' && this.links().length) {
        event.preventDefault();
        this.links()[0].focus();
      }
    });
    el.addEventListener('keydown', (event) => this.onKey(event));
  }

  links() {
    return [...this.el.querySelectorAll('a.search-hit')];
  }

  onKey(event) {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const links = this.links();
    const index = links.indexOf(document.activeElement);
    if (event.key === 'Escape') {
      event.preventDefault();
      this.input.focus();
    } else if (index !== -1 && (event.key === 'ArrowDown' || event.key === 'ArrowUp')) {
      event.preventDefault();
      const next = index + (event.key === 'ArrowDown' ? 1 : -1);
      if (next < 0) this.input.focus();
      else links[Math.min(next, links.length - 1)].focus();
    }
  }

  schedule() {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.search(), DEBOUNCE_MS);
  }

  // `again`: even if the words did not change (Enter: there may be new turns); `more`: the next page.
  async search({ again = false, more = false } = {}) {
    clearTimeout(this.timer);
    const q = this.input.value.trim();
    if (q.length < MIN_CHARS) {
      this.ticket++;
      this.query = '';
      this.el.hidden = true;
      return;
    }
    if (!again && !more && q === this.query) return; // typed a space, say
    if (q.length > MAX_CHARS) {
      this.show(q, [], { message: `Search for at most ${MAX_CHARS} characters.` });
      return;
    }
    const ticket = ++this.ticket;
    const page = more ? this.page + 1 : 1;
    if (!more) this.show(q, [], { message: 'Searching…', busy: true });
    try {
      const body = await api.search(q, page);
      if (ticket !== this.ticket) return; // a newer search went out meanwhile
      this.page = page;
      this.total = body.total;
      this.hasNext = body.has_next;
      this.show(q, more ? [...this.hits, ...body.hits] : body.hits, { focusFrom: more ? this.hits.length : null });
    } catch (error) {
      if (ticket !== this.ticket) return;
      const why = error instanceof NetworkError ? 'the server could not be reached' : error.message;
      this.show(q, more ? this.hits : [], { message: `Search failed: ${why}.` });
    }
  }

  show(q, hits, { message = null, busy = false, focusFrom = null } = {}) {
    this.query = q;
    this.hits = hits;
    const n = this.total;
    this.statusEl.textContent = message || (n ? `${n} ${n === 1 ? 'turn matches' : 'turns match'}` : 'No messages match.');
    if (busy) this.statusEl.setAttribute('aria-busy', 'true');
    else this.statusEl.removeAttribute('aria-busy');
    this.listEl.replaceChildren(...hits.map((hit) => this.renderHit(hit)));
    this.listEl.hidden = !hits.length;
    this.moreEl.hidden = !(this.hasNext && hits.length && !message);
    this.el.hidden = false;
    if (focusFrom !== null) this.links()[focusFrom]?.focus();
  }

  renderHit(hit) {
    const href = `/sessions/${hit.session_id}/#run-${hit.run_id}`;
    const title = sessionTitle({ id: hit.session_id, title: hit.session_title });
    return h(
      'li',
      null,
      h(
        'a',
        {
          class: 'search-hit',
          href,
          dataset: { sessionId: String(hit.session_id), runId: String(hit.run_id) },
          onclick: (event) => {
            if (event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey || event.altKey) return;
            if (this.onOpen(hit.session_id, hit.run_id)) {
              event.preventDefault();
              history.replaceState(history.state, '', href);
            }
          },
        },
        h('span', { class: 'hit-head' }, h('span', { class: 'hit-title', text: title }), h('time', { datetime: hit.created_at, text: when(hit.created_at) })),
        h('span', { class: 'hit-project', text: hit.project_name }),
        h('span', { class: 'hit-snippet' }, snippetNodes(hit.snippet)),
      ),
    );
  }
}
