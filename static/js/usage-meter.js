// The context meter beside the composer: how full the agent's context window is, from the last
// `usage_update` of the session's turns (`usage.updated`, folded by runstate.js), with the agent's
// cumulative cost when it gives one. Fed what the status line's gauge is fed (session.js lastUsage).

import { formatTokens, h } from './dom.js';

// Past these shares of the window the meter warns, then alarms (the agent may compact or fail).
const HIGH = 0.75;
const FULL = 0.9;

export class UsageMeter {
  constructor(root) {
    this.root = root;
  }

  set(usage) {
    const used = usage?.used;
    const size = usage?.size;
    if (typeof used !== 'number' || typeof size !== 'number' || size <= 0) {
      this.root.hidden = true;
      return;
    }
    const share = Math.min(1, used / size);
    const level = share >= FULL ? 'full' : share >= HIGH ? 'high' : 'ok';
    const cost = usage.cost && typeof usage.cost === 'object' && typeof usage.cost.amount === 'number' ? usage.cost : null;
    const costText = cost ? ` · ${cost.amount.toFixed(cost.amount < 1 ? 4 : 2)} ${cost.currency || ''}`.trimEnd() : '';
    const drawn = `${used}/${size}/${costText}`;
    this.root.hidden = false;
    this.root.dataset.level = level;
    if (drawn === this.drawn) return;
    this.drawn = drawn;
    const percent = Math.round(share * 100);
    const fill = h('span', { class: 'usage-meter-fill' });
    fill.style.width = `${percent}%`; // through the CSSOM: the pages' CSP refuses style attributes
    this.root.replaceChildren(
      h('span', { class: 'usage-meter-bar', 'aria-hidden': 'true' }, fill),
      h('span', { class: 'usage-meter-text', text: `Context ${percent}%${costText}` }),
    );
    this.root.setAttribute('role', 'meter');
    this.root.setAttribute('aria-valuemin', '0');
    this.root.setAttribute('aria-valuemax', String(size));
    this.root.setAttribute('aria-valuenow', String(used));
    this.root.setAttribute('aria-label', 'Context used');
    this.root.title = `Context: ${formatTokens(used)} of ${formatTokens(size)} tokens (${used} / ${size})${cost ? `; cost so far ${cost.amount} ${cost.currency}` : ''}`;
  }
}
