// Config option pickers beside the composer (docs/agents.md, "Config options"): drawn generically
// from whatever `configOptions` the agent reported for the session — a select (its values, in
// <optgroup>s when the agent grouped them) or a checkbox for a boolean. A choice is PATCHed as
// {config: {id: value}} and reaches the agent (session/set_config_option) before the next turn.

import { api } from './api.js';
import { h } from './dom.js';

const FIELDS = ['config_options', 'config'];

export class ConfigPickers {
  constructor(root, status, session) {
    this.root = root;
    this.status = status;
    this.sessionId = session.id;
    this.state = { config_options: [], config: {} };
    this.apply(session);
  }

  // A session as the API or the live snapshot has it; fields it lacks are kept.
  apply(session) {
    for (const key of FIELDS) if (session[key] !== undefined && session[key] !== null) this.state[key] = session[key];
    this.render();
  }

  // What the picker shows: the user's choice, else the agent's current value.
  value(option) {
    const chosen = this.state.config[option.id];
    return chosen === undefined || chosen === '' ? option.current : chosen;
  }

  render() {
    const options = this.state.config_options || [];
    this.root.hidden = !options.length;
    // Drawn again only when the options change, so a list the user has open stays (as pickers.js).
    const drawn = JSON.stringify(options.map((o) => [o.id, o.name, o.type, o.description, o.values]));
    if (drawn !== this.drawn) {
      this.drawn = drawn;
      this.root.replaceChildren(...options.map((option) => this.picker(option)));
    }
    for (const option of options) {
      const input = this.root.querySelector(`[data-config-id="${CSS.escape(option.id)}"]`);
      if (!input || document.activeElement === input) continue;
      if (option.type === 'boolean') input.checked = this.value(option) === true;
      else input.value = String(this.value(option) ?? '');
    }
  }

  picker(option) {
    const id = `config-${option.id}`;
    const title = option.description || null;
    if (option.type === 'boolean') {
      const box = h('input', { type: 'checkbox', id, 'data-config-id': option.id, 'aria-describedby': 'picker-status' });
      box.addEventListener('change', () => this.save(option, box.checked));
      return h('span', { class: 'picker picker-boolean', title }, box, h('label', { for: id, text: option.name }));
    }
    const select = h('select', { id, 'data-config-id': option.id, 'aria-describedby': 'picker-status' }, ...this.choices(option));
    select.addEventListener('change', () => this.save(option, select.value));
    return h('span', { class: 'picker', title }, h('label', { for: id, text: option.name }), select);
  }

  // A select's values; those with a group go under its <optgroup>, in the agent's order.
  choices(option) {
    const out = [];
    let group = null;
    for (const v of option.values || []) {
      const el = h('option', { value: v.value, title: v.description || null, text: v.name || v.value });
      if (!v.group) {
        group = null;
        out.push(el);
      } else {
        if (!group || group.label !== v.group) {
          group = h('optgroup', { label: v.group });
          out.push(group);
        }
        group.append(el);
      }
    }
    const current = this.value(option);
    if (current && !(option.values || []).some((v) => v.value === current)) out.unshift(h('option', { value: current, text: `${current} (not offered)` }));
    return out;
  }

  async save(option, value) {
    this.say('Saving…');
    try {
      this.apply(await api.updateSession(this.sessionId, { config: { [option.id]: value } }));
      const shown = option.type === 'boolean' ? (value ? 'on' : 'off') : option.values.find((v) => v.value === value)?.name || value;
      this.say(`${option.name}: ${shown}. Applies from the next turn.`);
    } catch (error) {
      this.drawn = null; // back to what the session has
      this.render();
      this.say(`Not changed: ${error.message}`, true);
    }
  }

  say(text, failed = false) {
    this.status.textContent = text;
    this.status.dataset.failed = failed ? 'true' : 'false';
  }
}
