// The status line: connection state, run status, context gauge.

import { formatTokens, h, humanize } from './dom.js';
import { waitingText } from './waiting.js';

const CONNECTION_LABELS = {
  connecting: 'connecting…',
  live: 'live',
  reconnecting: 'reconnecting…',
  offline: 'offline',
  idle: 'not connected',
};

export class StatusLine {
  constructor(root, { onRetry }) {
    this.root = root;
    this.connection = root.querySelector('[data-role=connection]');
    this.run = root.querySelector('[data-role=run-status]');
    this.usage = root.querySelector('[data-role=usage]');
    this.onRetry = onRetry;
  }

  setConnection(state, info = {}) {
    this.connection.dataset.state = state;
    const label = CONNECTION_LABELS[state] || state;
    const parts = [h('span', { class: 'dot', 'aria-hidden': 'true' }), h('span', { class: 'label', text: label })];
    if (state === 'offline' || state === 'reconnecting') {
      const seconds = Math.max(0, Math.round(((info.nextAttemptAt || 0) - Date.now()) / 1000));
      if (seconds > 1) parts.push(h('span', { class: 'muted', text: ` (retry in ${seconds}s)` }));
      parts.push(h('button', { type: 'button', class: 'btn link small', text: 'Retry now', onclick: () => this.onRetry() }));
    }
    this.connection.replaceChildren(...parts);
  }

  setRun(status) {
    this.status = status;
    const waiting = status === 'queued' ? waitingText(this.waiting) : '';
    this.run.dataset.status = waiting ? 'waiting' : status || 'idle';
    this.run.textContent = waiting || (status ? humanize(status) : 'idle');
  }

  // Why the session's queued turn waits (the user's `sessions` frames): shown while it is queued.
  setWaiting(waiting) {
    this.waiting = waiting || null;
    this.setRun(this.status);
  }

  setUsage(usage) {
    const used = usage?.used;
    const size = usage?.size;
    if (typeof used !== 'number' || typeof size !== 'number' || size <= 0) {
      this.usage.hidden = true;
      return;
    }
    const percent = Math.min(100, Math.round((used / size) * 100));
    const cost = usage.cost;
    const costText =
      cost && typeof cost === 'object' ? ` · ${cost.amount?.toFixed?.(4) ?? cost.amount} ${cost.currency || ''}` : typeof cost === 'number' ? ` · $${cost.toFixed(4)}` : '';
    this.usage.hidden = false;
    this.usage.replaceChildren(
      h('meter', { min: '0', max: String(size), value: String(used), low: String(size * 0.7), high: String(size * 0.9), optimum: '0', 'aria-label': 'Context used' }),
      h('span', { class: 'usage-text', text: `${formatTokens(used)} / ${formatTokens(size)} (${percent}%)${costText}` }),
    );
    this.usage.title = `Context: ${used} of ${size} tokens`;
  }
}
