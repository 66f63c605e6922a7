// Pending-intent cards above the composer (docs/intents.md; the pending intent RFC's
// "Visible Timeline Contract"): a waiting message reads as waiting, not as sent.
//
// Queue items can be edited, deleted, reordered, upgraded to Steer (one way)
// or sent with Stop-and-send. A steer on its way and a stop-and-send in flight
// are shown without edit controls: they can no longer be taken back.

import { api } from './api.js';
import { h, heldWhilePressed } from './dom.js';

export class IntentsPanel {
  constructor(el, { act }) {
    this.el = el;
    this.act = act; // async (action, intent, extra) => message or null
    this.intents = [];
    this.activeRunId = null;
    this.drafts = new Map();
    this.messages = new Map();
    this.busy = new Set();
    // On a phone the queue folds to one summary line, so the transcript (and what waits
    // for the user in it) keeps the screen; the summary expands it.
    this.narrow = window.matchMedia('(max-width: 800px)');
    this.queueOpen = false;
    this.narrow.addEventListener('change', () => this.render());
    // A session's snapshot redraws the cards: it waits while a card is being pressed (dom.js says why).
    this.render = heldWhilePressed(el, () => this.draw());
  }

  setIntents(intents) {
    this.intents = (intents || []).filter((i) => i.state === 'waiting' || i.state === 'stopping');
    const ids = new Set(this.intents.map((i) => i.id));
    for (const id of [...this.drafts.keys()]) if (!ids.has(id)) this.drafts.delete(id);
    this.render();
  }

  setActiveRun(runId) {
    if (this.activeRunId === runId) return;
    this.activeRunId = runId;
    this.render();
  }

  queued() {
    return this.intents
      .filter((i) => i.kind === 'queue' && i.state === 'waiting')
      .sort((a, b) => a.position - b.position || a.id - b.id);
  }

  draw() {
    const focused = document.activeElement;
    const focusKey = this.el.contains(focused) ? focused.dataset.focusKey : null;
    const selection = focused?.tagName === 'TEXTAREA' ? [focused.selectionStart, focused.selectionEnd] : null;
    const stopping = this.intents.filter((i) => i.state === 'stopping');
    const steering = this.intents.filter((i) => i.kind === 'steer' && i.state === 'waiting');
    const queued = this.queued();
    const folded = this.narrow.matches && queued.length > 0;
    const cards = [
      ...stopping.map((i) => this.renderStopping(i)),
      ...steering.map((i) => this.renderSteering(i)),
      folded ? this.renderSummary(queued) : null,
      ...(folded && !this.queueOpen ? [] : queued.map((i, index) => this.renderQueued(i, index, queued.length))),
    ].filter(Boolean);
    this.el.replaceChildren(...cards);
    this.el.hidden = cards.length === 0;
    if (focusKey) {
      const again = this.el.querySelector(`[data-focus-key="${CSS.escape(focusKey)}"]`);
      if (again) {
        again.focus();
        if (selection && again.tagName === 'TEXTAREA') again.setSelectionRange(...selection);
      }
    }
  }

  renderSummary(queued) {
    const first = queued[0].text.split('\n')[0];
    return h(
      'button',
      {
        type: 'button',
        class: 'queue-summary',
        'aria-expanded': String(this.queueOpen),
        dataset: { focusKey: 'queue-summary' },
        onclick: () => {
          this.queueOpen = !this.queueOpen;
          this.render();
        },
      },
      h('span', { class: 'badge badge-queue', text: `${queued.length} queued` }),
      h('span', { class: 'queue-summary-text', text: first }),
      h('span', { class: 'queue-summary-toggle', 'aria-hidden': 'true', text: this.queueOpen ? '▾' : '▸' }),
    );
  }

  message(intent) {
    const note = this.messages.get(intent.id) || intent.reason;
    return note ? h('div', { class: 'intent-reason', role: 'status', text: note }) : null;
  }

  renderStopping(intent) {
    return h(
      'div',
      { class: 'intent-card', dataset: { intentId: String(intent.id), kind: intent.kind, state: intent.state } },
      h('div', { class: 'intent-head' }, h('span', { class: 'badge badge-stop', text: 'Stop-and-send' }), h('span', { class: 'intent-state', text: 'stopping the current run; this goes next' })),
      h('div', { class: 'intent-text', text: previewText(intent) }),
      this.message(intent),
    );
  }

  renderSteering(intent) {
    return h(
      'div',
      { class: 'intent-card', dataset: { intentId: String(intent.id), kind: intent.kind, state: intent.state } },
      h('div', { class: 'intent-head' }, h('span', { class: 'badge badge-steer', text: 'Steer' }), h('span', { class: 'intent-state', text: 'delivering to the running agent…' })),
      h('div', { class: 'intent-text', text: previewText(intent) }),
      this.message(intent),
    );
  }

  // A long message is listed as a preview (`truncated`): edit the whole text.
  async startEdit(intent) {
    let text = intent.text;
    if (intent.truncated) {
      this.busy.add(intent.id);
      this.render();
      try {
        text = (await api.intent(intent.id)).text;
      } catch {
        text = undefined;
      } finally {
        this.busy.delete(intent.id);
      }
      if (text === undefined) {
        this.messages.set(intent.id, 'Could not load the whole message; try again.');
        this.render();
        return;
      }
    }
    this.drafts.set(intent.id, text);
    this.render();
    this.el.querySelector(`[data-focus-key="edit:${intent.id}"]`)?.focus();
  }

  renderQueued(intent, index, count) {
    const id = intent.id;
    const busy = this.busy.has(id);
    const editing = this.drafts.has(id);
    const run = (action, extra) => async () => {
      this.busy.add(id);
      this.messages.delete(id);
      this.render();
      let note = null;
      try {
        note = await this.act(action, intent, extra);
      } finally {
        this.busy.delete(id);
        if (note) this.messages.set(id, note);
        if (action === 'edit' && !note) this.drafts.delete(id);
        this.render();
      }
    };
    const save = () => {
      const text = this.drafts.get(id) ?? intent.text;
      if (!text.trim()) {
        this.messages.set(id, 'A message needs some text; delete it instead.');
        this.render();
        return;
      }
      run('edit', { text })();
    };
    const canSteer = this.activeRunId !== null;
    const body = editing
      ? h('textarea', {
          class: 'intent-edit',
          rows: 2,
          value: this.drafts.get(id),
          'aria-label': 'Edit queued message',
          dataset: { focusKey: `edit:${id}` },
          oninput: (event) => this.drafts.set(id, event.target.value),
          onkeydown: (event) => {
            if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
              event.preventDefault();
              save();
            } else if (event.key === 'Escape') {
              this.drafts.delete(id);
              this.render();
            }
          },
        })
      : h('div', { class: 'intent-text', text: previewText(intent) });
    const button = (label, action, props = {}) =>
      h('button', { type: 'button', class: `btn small ${props.class || ''}`, disabled: busy || props.disabled, title: props.title, 'aria-label': props.label, dataset: { action, focusKey: `${action}:${id}` }, text: label, onclick: props.onclick || run(action, props.extra) });
    const actions = editing
      ? [button('Save', 'save', { class: 'primary', onclick: save }), button('Cancel', 'cancel-edit', { onclick: () => (this.drafts.delete(id), this.render()) })]
      : [
          button('↑', 'up', { disabled: index === 0, label: 'Move up', title: 'Move up', extra: { position: index - 1 } }),
          button('↓', 'down', { disabled: index === count - 1, label: 'Move down', title: 'Move down', extra: { position: index + 1 } }),
          button('Edit', 'edit-start', { onclick: () => this.startEdit(intent) }),
          button('Delete', 'delete', { class: 'danger-text' }),
          button('Steer', 'steer', { disabled: !canSteer, title: 'Deliver to the running agent now (cannot be undone)' }),
          button('Stop & send', 'stop-and-send', { class: 'danger', title: 'Cancel the current run and send this message next' }),
        ];
    const source = intent.source === 'leftover_steer' ? 'leftover steer' : null;
    return h(
      'div',
      { class: 'intent-card', dataset: { intentId: String(id), kind: intent.kind, state: intent.state, position: String(index) } },
      h(
        'div',
        { class: 'intent-head' },
        h('span', { class: 'badge badge-queue', text: `Queued #${index + 1}` }),
        h('span', { class: 'intent-state', text: source ? `waiting (${source})` : 'waits for the current run to finish' }),
      ),
      body,
      this.message(intent),
      h('div', { class: 'intent-actions' }, actions),
    );
  }
}

function previewText(intent) {
  return intent.truncated ? `${intent.text}… (${intent.text_length.toLocaleString()} characters)` : intent.text;
}
