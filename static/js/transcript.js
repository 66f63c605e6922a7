// One turn of the conversation: the user's prompt and everything the run did.
//
// A TurnView owns a run's materialized state (runstate.js) and the DOM built
// from it. Events mark items dirty; flush() redraws only those. Live text is
// rendered as markdown in the browser with the server's rules (markdown.js),
// only the blocks that changed; once the run has settled the server's rendering
// is laid over it, block by block, so equal blocks are not touched at all.

import { api, NetworkError } from './api.js';
import { renderAttachmentList } from './attachments.js';
import { copyText, formatTokens, h, heldWhilePressed, humanize, swap } from './dom.js';
import { LiveMarkdown, showMarkdown, showServerHtml } from './markdown.js';
import { applyEvent, emptyState, indexItems, relink, TERMINAL_STATES } from './runstate.js';
import { RENDERERS } from './transcript-items.js';

// A live render may take at most 1/LIVE_BUDGET of the time: a huge text re-renders less often.
const LIVE_BUDGET = 6;
// A finished turn that came cut is caught up from the socket's replay, thousands of events a
// frame: it is drawn when its end comes, or at most this often until then. Each draw lays out
// the whole long turn, so drawing it on every frame of the replay cost more than the replay.
const CATCH_UP_DRAW_MS = 1000;

// Text drawn plain (a settled turn waiting for the server's rendering, or a finished segment of
// a turn loaded part-way) gets the browser's markdown only when it comes near the view, so a
// long turn costs what is on screen, not all of its text. The server's rendering, when it comes
// first, makes this moot.
const lazyJobs = new WeakMap();
const lazyMarkdown = new IntersectionObserver(
  (entries) => {
    for (const entry of entries) {
      if (!entry.isIntersecting) continue;
      lazyMarkdown.unobserve(entry.target);
      const job = lazyJobs.get(entry.target);
      lazyJobs.delete(entry.target);
      if (job && !entry.target.classList.contains('rendered')) job();
    }
  },
  { rootMargin: '1200px 0px' },
);

const SOURCE_LABELS = {
  queue: 'from the queue',
  stop_and_send: 'stop-and-send',
  leftover_steer: 'leftover steer, sent as a turn',
  workflow: 'workflow',
};

const WAITING_LABELS = {
  queued: 'Queued — waiting for the runner…',
  running: 'Working…',
  awaiting_approval: 'Waiting for your approval',
  awaiting_clarify: 'Waiting for your answer',
  cancelling: 'Cancelling…',
};

const BANNERS = {
  cancelled: 'Cancelled',
  failed: 'Failed',
  interrupted: 'Interrupted',
};

// The control inside `node` that has the focus, as a selector its redrawn twin answers to (a
// fold's button by its key, a <details>' summary by the details' key); null when there is none.
function focusedControl(node) {
  const active = document.activeElement;
  if (!active || active === node || !node.contains(active)) return null;
  if (active.dataset?.foldKey) return `[data-fold-key="${CSS.escape(active.dataset.foldKey)}"]`;
  const details = active.closest('details[data-key]');
  if (active.tagName === 'SUMMARY' && details) return `details[data-key="${CSS.escape(details.dataset.key)}"] > summary`;
  return null;
}

// Keep `node` at `top` in the view while what was put above it is laid out: plain text is sized
// only once near the view (.md.plain's content-visibility), a frame or two after it is added.
// Until it holds still for two frames, at most half a second, or the reader scrolls.
async function keepInPlace(node, top, scroller) {
  let still = 0;
  let reader = false;
  const stop = () => (reader = true);
  const events = ['wheel', 'touchstart', 'keydown'];
  for (const name of events) scroller.addEventListener(name, stop, { passive: true, once: true });
  for (let frame = 0; frame < 30 && still < 2 && !reader && !document.hidden; frame++) {
    const drift = node.getBoundingClientRect().top - top;
    if (Math.abs(drift) >= 1) {
      scroller.scrollTop += drift;
      still = 0;
    } else {
      still += 1;
    }
    await new Promise((resolve) => requestAnimationFrame(resolve));
  }
  for (const name of events) scroller.removeEventListener(name, stop);
}

export class TurnView {
  constructor(turn, handlers) {
    this.runId = turn.run_id;
    this.turn = turn;
    this.state = relink(turn.state || emptyState());
    this.handlers = handlers;
    this.nodes = new Map();
    this.dirty = new Set();
    this.runDirty = true;
    this.rendered = false;
    this.renderedTerminal = false;
    this.controlMessages = new Map();
    this.busy = new Set();
    this.expanded = new Set(); // folded tool outputs and diff context the user opened
    this.liveCost = new Map(); // text item → {at, cost, parsed} of its last live render
    this.live = new Map(); // text item → its LiveMarkdown
    this.deferred = new Set();
    this.settledAtStart = !!this.state.terminal;
    // The run had ended when its page was read, but the page holds only its start (`complete` false).
    this.catchingUp = turn.complete === false && TERMINAL_STATES.has(turn.status) && !this.state.terminal;
    this.tooLarge = false; // the server said its rendering is too large (TurnFeed.applyFragments, feed.js)
    // A finished turn larger than a page came from its end: its first `itemsFrom` items are read
    // back on demand (loadEarlierItems). Item nodes' `data-item` is the index in the whole run.
    this.itemsFrom = turn.items_from || 0;
    this.loadingEarlier = null;
    this.drawnAt = performance.now();
    this.el = this.build();
    // Items whose redraw waits for a press inside the turn to end: a card redrawn under the
    // pointer (a tool's output streaming) would lose the click on its fold (dom.js).
    this.held = new Set();
    this.redrawSoon = heldWhilePressed(this.el, (item, index) => this.redrawNow(item, index));
    for (const item of this.state.items) this.dirty.add(item);
    this.flush();
  }

  get terminal() {
    return this.state.terminal;
  }

  get status() {
    if (this.state.terminal) return this.state.terminal_state;
    if (this.state.last_seq === 0 && this.turn.status) return this.turn.status;
    return this.state.status;
  }

  get lastSeq() {
    return this.state.last_seq;
  }

  build() {
    const meta = this.turn.source_meta || {};
    const label =
      this.turn.source === 'workflow' && meta.workflow_name
        ? `workflow: ${meta.workflow_name}`
        : SOURCE_LABELS[this.turn.source];
    this.itemsEl = h('div', { class: 'items' });
    this.earlierButton = h('button', { type: 'button', class: 'btn small', onclick: () => this.loadEarlierItems() });
    this.earlierNote = h('span', { class: 'load-earlier-note', role: 'status' });
    this.earlierEl = h('div', { class: 'load-earlier turn-earlier' }, this.earlierButton, this.earlierNote);
    this.renderEarlier();
    this.progressEl = h('div', { class: 'turn-progress', 'aria-live': 'polite' });
    this.bannerEl = h('div', { class: 'turn-banner', hidden: true });
    this.footerEl = h('div', { class: 'turn-footer' });
    const prompt = this.turn.prompt_text || '';
    const action = (text, label, onclick, role) =>
      h('button', { type: 'button', class: 'btn link small turn-action', 'aria-label': label, dataset: { action: role }, text, onclick });
    const feedback = (button, ok) => {
      button.textContent = ok ? 'Copied' : 'Copy failed';
      setTimeout(() => (button.textContent = 'Copy'), 1500);
    };
    this.answerActionsEl = h(
      'div',
      { class: 'turn-actions answer-actions', hidden: true },
      action('Copy', 'Copy answer', async (event) => {
        const button = event.currentTarget;
        const text = await this.wholeAnswerText();
        feedback(button, text !== null && (await copyText(text)));
      }, 'copy-answer'),
    );
    return h(
      'article',
      // The id is the address a search hit opens (`#run-<id>`, SessionController.revealRun).
      { class: 'turn', id: `run-${this.runId}`, tabindex: '-1', 'aria-label': `Turn: ${prompt.slice(0, 80)}`, dataset: { runId: String(this.runId), source: this.turn.source || '' } },
      h(
        'div',
        { class: 'user-turn' },
        h('div', { class: 'bubble user-text', text: prompt }),
        renderAttachmentList(this.turn.attachments),
        h(
          'div',
          { class: 'turn-meta' },
          label ? h('span', { class: 'turn-source', text: label }) : null,
          h(
            'span',
            { class: 'turn-actions prompt-actions' },
            action('Copy', 'Copy prompt', async (event) => feedback(event.currentTarget, await copyText(prompt)), 'copy-prompt'),
            action('Edit', 'Edit prompt in the composer', () => this.handlers.edit?.(this), 'edit'),
            action('Retry', 'Retry: send this prompt again', () => this.handlers.retry?.(this), 'retry'),
          ),
        ),
      ),
      h('div', { class: 'assistant' }, this.earlierEl, this.itemsEl, this.progressEl, this.bannerEl, h('div', { class: 'turn-end' }, this.footerEl, this.answerActionsEl)),
    );
  }

  renderEarlier(failed = false) {
    const left = this.itemsFrom;
    this.earlierEl.hidden = !left && !this.earlierNote.textContent;
    this.earlierButton.hidden = !left;
    // Busy, not disabled: a keyboard user's focus stays on it while the page comes.
    this.earlierButton.setAttribute('aria-busy', this.loadingEarlier ? 'true' : 'false');
    const what = `${left} earlier ${left === 1 ? 'part' : 'parts'} of this answer`;
    this.earlierButton.textContent = this.loadingEarlier ? 'Loading…' : failed ? `Try again: show ${what}` : `Show ${what}`;
  }

  // The turn's items before `itemsFrom`, a page of them put above the first one without moving
  // what the reader sees. Resolves to whether any are left.
  loadEarlierItems() {
    if (this.loadingEarlier) return this.loadingEarlier;
    if (!this.itemsFrom) return Promise.resolve(false);
    this.loadingEarlier = (async () => {
      let failed = false;
      try {
        const page = await api.runItems(this.runId, this.itemsFrom);
        // The item that was first stays where it was (the browser's scroll anchoring may have
        // kept it there already: only what is left is corrected).
        const first = this.itemsEl.firstElementChild;
        const top = first?.getBoundingClientRect().top;
        this.prependItems(page.items, page.items_from);
        const scroller = this.el.closest('[data-role=scroller]');
        if (first && scroller) await keepInPlace(first, top, scroller);
        this.earlierNote.textContent = this.itemsFrom ? '' : 'The whole answer is shown.';
      } catch (error) {
        failed = true;
        this.earlierNote.textContent = 'Could not load the earlier part of this answer.';
        if (!(error instanceof NetworkError)) console.warn('earlier items failed', error);
      } finally {
        const hadFocus = this.earlierButton === document.activeElement;
        this.loadingEarlier = null;
        this.renderEarlier(failed);
        // The button went with the last page: keyboard focus stays in this turn.
        if (hadFocus && this.earlierButton.hidden) this.el.focus({ preventScroll: true });
      }
      return this.itemsFrom > 0 && !failed;
    })();
    this.renderEarlier();
    return this.loadingEarlier;
  }

  // Items read back (`items`, from index `from` of the run's) go before the ones held.
  prependItems(items, from) {
    if (from + items.length !== this.itemsFrom) return; // not the page before ours: dropped
    this.itemsFrom = from;
    this.state.items.unshift(...items);
    indexItems(this.state, items);
    const nodes = items.map((item, index) => {
      const node = this.renderItem(item, index);
      this.nodes.set(item, node);
      return node;
    });
    this.itemsEl.prepend(...nodes);
  }

  // The whole answer's text, its earlier items read back first if the turn came from its end;
  // null when they could not be.
  async wholeAnswerText() {
    while (this.itemsFrom) if (!(await this.loadEarlierItems()) && this.itemsFrom) return null;
    return this.answerText();
  }

  // The agent's text of this turn, as markdown.
  answerText() {
    return this.state.items
      .filter((item) => item.kind === 'text')
      .map((item) => item.text.trim())
      .filter(Boolean)
      .join('\n\n');
  }

  // Returns false for an event already applied (replay overlap).
  apply(event) {
    const change = applyEvent(this.state, event);
    if (change === null) return false;
    if (change.item) this.dirty.add(change.item);
    if (change.created && change.item.kind === 'plan') {
      // The previous plan card is superseded: it hides.
      for (const item of this.state.items) if (item.kind === 'plan' && item !== change.item) this.dirty.add(item);
    }
    this.runDirty = true;
    if (event.type === 'approval.resolved' || event.type === 'clarify.resolved') {
      // The answer is on record now; what the click said in the meantime is moot.
      const key = event.type === 'approval.resolved' ? `approval:${event.payload?.approval_id}` : `clarify:${event.payload?.clarify_id}`;
      this.busy.delete(key);
      this.controlMessages.delete(key);
    }
    if (event.type === 'done') {
      // A request that was still open is now moot: redraw it as expired.
      for (const item of this.state.items) if (item.kind === 'approval' || item.kind === 'clarify') this.dirty.add(item);
    }
    return true;
  }

  // How long until this turn may be drawn again (0: now). A finished turn still catching up on
  // its replay waits for its end, or for CATCH_UP_DRAW_MS since it was last drawn.
  holdFor() {
    if (!this.catchingUp) return 0;
    if (this.state.terminal) {
      this.catchingUp = false;
      return 0;
    }
    return Math.max(0, this.drawnAt + CATCH_UP_DRAW_MS - performance.now());
  }

  // Returns true when a text was left for a later frame (it is costly to render).
  flush() {
    this.drawnAt = performance.now();
    if (this.dirty.size) {
      const items = this.state.items;
      for (let index = 0; index < items.length; index++) {
        const item = items[index];
        if (!this.dirty.has(item)) continue;
        const node = this.nodes.get(item);
        if (!node) {
          const fresh = this.renderItem(item, index);
          this.nodes.set(item, fresh);
          this.itemsEl.append(fresh);
        } else {
          this.updateItem(item, node, index);
        }
      }
      this.dirty.clear();
    }
    if (this.runDirty) {
      this.runDirty = false;
      this.renderRunParts();
    }
    if (!this.deferred.size) return false;
    for (const item of this.deferred) this.dirty.add(item);
    this.deferred.clear();
    return true;
  }

  // Render a streaming text as markdown. Only its changed blocks are replaced (markdown.js),
  // and a text that takes long to render is rendered less often, so the page stays responsive.
  renderLive(item, node) {
    const now = performance.now();
    const last = this.liveCost.get(item);
    let live = this.live.get(item);
    // What the next render parses: the text after the frozen blocks (markdown.js LiveMarkdown).
    // A render that froze most of a long text costs far less than the one before it.
    const parse = live?.container === node ? live.unfrozen(item.text) : item.text.length;
    const share = Math.min(1, parse / Math.max(last?.parsed ?? 1, 1));
    if (last && now - last.at < last.cost * share * LIVE_BUDGET) {
      this.deferred.add(item);
      return;
    }
    if (live?.container !== node) {
      live = new LiveMarkdown(node);
      this.live.set(item, live);
    }
    if (node.classList.contains('plain')) {
      // Drawn plain at first, streaming again now: it is live from here on.
      lazyJobs.delete(node);
      node.classList.replace('plain', 'live');
    }
    live.show(item.text);
    this.liveCost.set(item, { at: performance.now(), cost: performance.now() - now, parsed: parse });
  }

  // A text shown plain for now: rendered as markdown in the browser once it nears the view.
  drawLazily(item) {
    const node = h('div', { class: 'md plain', text: item.text });
    lazyJobs.set(node, () => {
      showMarkdown(node, item.text);
      node.classList.replace('plain', 'live'); // rendered in the browser, as a streaming text is
    });
    lazyMarkdown.observe(node);
    return node;
  }

  renderItem(item, index) {
    const node = RENDERERS[item.kind]?.(item, this) ?? h('div', { class: 'item-unknown', text: item.kind });
    node.dataset.item = String(this.itemsFrom + index);
    node.classList.add('item', `item-${item.kind}`);
    return node;
  }

  updateItem(item, node, index) {
    if (item.kind === 'text') {
      if (!node.classList.contains('rendered')) this.renderLive(item, node);
      return;
    }
    if (item.kind === 'reasoning') {
      node.querySelector('.reasoning-text').textContent = item.text;
      node.querySelector('summary').textContent = item.done ? 'Thought' : 'Thinking…';
      node.dataset.done = String(!!item.done);
      return;
    }
    if (item.kind === 'clarify' && node.dataset.resolved === String(!!item.resolved) && !this.terminal) {
      return; // keep what the user is typing
    }
    this.held.add(item);
    this.redrawSoon(item, index);
  }

  // `item` now, or, after a press (no item), every item the press held.
  redrawNow(item, index) {
    if (item === undefined) {
      for (const waiting of this.held) this.redraw(waiting);
      this.held.clear();
      return;
    }
    this.held.delete(item);
    this.swapItem(item, index);
  }

  // The item drawn again, with the focus (a fold's button or summary) on its new twin.
  swapItem(item, index) {
    const node = this.nodes.get(item);
    if (!node) return;
    const focused = focusedControl(node);
    const fresh = swap(node, this.renderItem(item, index));
    this.nodes.set(item, fresh);
    if (focused) fresh.querySelector(focused)?.focus({ preventScroll: true });
  }

  renderRunParts() {
    const status = this.status;
    this.el.dataset.status = status || '';
    const waiting = !this.terminal ? WAITING_LABELS[status] : null;
    this.progressEl.hidden = !waiting;
    if (waiting) {
      const detail = this.state.progress && status === 'running' ? this.state.progress : waiting;
      this.progressEl.replaceChildren(h('span', { class: 'spinner', 'aria-hidden': 'true' }), h('span', { text: detail }));
    }
    const banner = this.terminal ? BANNERS[this.state.terminal_state] : null;
    this.bannerEl.hidden = !banner;
    if (banner) {
      const lastError = this.state.errors.length ? this.state.errors[this.state.errors.length - 1] : null;
      let reason = this.state.terminal_reason || this.turn.error || lastError?.message || this.state.stop_reason || '';
      if (reason.toLowerCase() === this.state.terminal_state) reason = '';
      this.bannerEl.className = `turn-banner banner-${this.state.terminal_state}`;
      this.bannerEl.setAttribute('role', this.state.terminal_state === 'cancelled' ? 'status' : 'alert');
      this.bannerEl.replaceChildren(h('strong', { text: banner }), reason ? h('span', { class: 'reason', text: reason }) : null);
    }
    const parts = [];
    if (this.terminal && this.state.stop_reason && !['end_turn', 'cancelled'].includes(this.state.stop_reason)) {
      parts.push(`stopped: ${humanize(this.state.stop_reason)}`);
    }
    const usage = this.state.usage_final || {};
    const total = usage.totalTokens ?? usage.total_tokens;
    if (typeof total === 'number') parts.push(`${formatTokens(total)} tokens`);
    this.footerEl.textContent = parts.join(' · ');
    this.footerEl.hidden = !parts.length;
    this.answerActionsEl.hidden = !this.terminal || !this.answerText();
  }

  // Swap live plain text for the sanitized markdown the server rendered.
  applyFragment(section) {
    for (const block of section.querySelectorAll('.md[data-item]')) {
      const item = this.state.items[Number(block.dataset.item) - this.itemsFrom];
      const node = item && this.nodes.get(item);
      if (!node || item.kind !== 'text' || (item.message_id ?? '') !== (block.dataset.messageId ?? '')) continue;
      // Read from the inert document as markup and sanitized again: nothing of it is adopted as is.
      showServerHtml(node, block.innerHTML);
      node.classList.remove('live', 'plain');
      node.classList.add('rendered');
      this.liveCost.delete(item);
      this.live.delete(item);
    }
    this.rendered = true;
  }

  // Fold state of tool outputs and diff context, kept across redraws of the card.
  isOpen(key) {
    return this.expanded.has(key);
  }

  toggle(key, item) {
    if (this.expanded.has(key)) this.expanded.delete(key);
    else this.expanded.add(key);
    this.redraw(item);
    this.nodes.get(item)?.querySelector(`[data-fold-key="${CSS.escape(key)}"]`)?.focus();
  }

  // Redraw one item now (an answer to a control came back).
  redraw(item) {
    this.swapItem(item, this.state.items.indexOf(item));
  }

  // A clarify form is not redrawn while open (it would drop what the user typed): patch it in place.
  clarifyFeedback(item, busy, message) {
    const node = this.nodes.get(item);
    if (!node) return;
    const button = node.querySelector('button[type=submit]');
    if (button) button.disabled = busy;
    node.querySelector('.control-message')?.remove();
    if (message) node.append(h('div', { class: 'control-message', role: 'status', text: message }));
  }

  setControlMessage(key, message) {
    if (message) this.controlMessages.set(key, message);
    else this.controlMessages.delete(key);
  }

  markBusy(key, busy) {
    if (busy) this.busy.add(key);
    else this.busy.delete(key);
  }
}
