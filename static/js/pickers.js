// Mode and model pickers beside the composer (docs/agents.md, "Modes and models").
// The mode is one of the modes the agent reported for the session; the model is free text with
// the agent's list as suggestions (Hermes lists only its current model yet serves others).
// A choice is PATCHed to the session and reaches the agent before the session's next turn.
// An agent whose config options include a mode or a model (category `mode`, `model`: Codex,
// Claude) is offered those instead (config-options.js): ACP's config options supersede modes.

import { api } from './api.js';
import { h } from './dom.js';

const FIELDS = ['mode', 'model', 'modes', 'models', 'config_options'];

export class Pickers {
  constructor(root, session) {
    this.root = root;
    this.sessionId = session.id;
    this.select = root.querySelector('[data-role=mode-picker]');
    this.input = root.querySelector('[data-role=model-picker]');
    this.options = root.querySelector('[data-role=model-options]');
    this.status = root.querySelector('[data-role=picker-status]');
    this.state = { mode: '', model: '', modes: [], models: [], config_options: [] };
    this.apply(session);
    this.select.addEventListener('change', () => this.save({ mode: this.select.value }));
    this.input.addEventListener('change', () => this.commitModel());
    this.input.addEventListener('keydown', (event) => {
      // Enter picks the model here: it must not send the composer's message.
      if (event.key === 'Enter') {
        event.preventDefault();
        this.commitModel();
      } else if (event.key === 'Escape') {
        this.input.value = this.state.model;
      }
    });
  }

  // A session as the API or the live snapshot has it; fields it lacks are kept.
  apply(session) {
    for (const key of FIELDS) if (session[key] !== undefined && session[key] !== null) this.state[key] = session[key];
    this.render();
  }

  render() {
    const { mode, model, modes, models } = this.state;
    const superseded = new Set((this.state.config_options || []).map((o) => o.category));
    this.select.closest('.picker').hidden = superseded.has('mode');
    this.input.closest('.picker').hidden = superseded.has('model');
    const choices = modes.map((m) => ({ id: m.id, name: m.name || m.id, description: m.description || '' }));
    if (mode && !choices.some((m) => m.id === mode)) choices.unshift({ id: mode, name: `${mode} (not offered)`, description: '' });
    if (!mode) choices.unshift({ id: '', name: "Agent's default", description: '' });
    // Every snapshot of the session lands here: the options are drawn again only when they change,
    // so a list the user has open is not pulled from under them.
    const drawn = JSON.stringify([choices, models]);
    if (drawn !== this.drawn) {
      this.drawn = drawn;
      this.select.replaceChildren(...choices.map((m) => h('option', { value: m.id, title: m.description || null, text: m.name })));
      this.options.replaceChildren(...models.map((m) => h('option', { value: m.id, text: m.name || m.id })));
    }
    this.select.value = mode;
    this.select.disabled = !modes.length;
    const current = choices.find((m) => m.id === mode);
    this.select.title = modes.length ? current?.description || '' : 'The agent reports its modes with the first turn.';
    // Not while the user types a model: a snapshot arriving then must not undo the typing.
    if (document.activeElement !== this.input) this.input.value = model;
  }

  commitModel() {
    const value = this.input.value.trim();
    if (value === this.state.model) return;
    this.save({ model: value });
  }

  async save(body) {
    this.say('Saving…');
    try {
      this.apply(await api.updateSession(this.sessionId, body));
      const [field] = Object.keys(body);
      const value = field === 'mode' ? this.modeName(body.mode) : body.model || "the agent's default";
      this.say(`${field === 'mode' ? 'Mode' : 'Model'}: ${value}. Applies from the next turn.`);
    } catch (error) {
      this.render(); // back to what the session has
      this.say(`Not changed: ${error.message}`, true);
    }
  }

  modeName(id) {
    return this.state.modes.find((m) => m.id === id)?.name || id || "the agent's default";
  }

  say(text, failed = false) {
    this.status.textContent = text;
    this.status.dataset.failed = failed ? 'true' : 'false';
  }
}
