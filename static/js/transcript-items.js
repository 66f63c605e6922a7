// How each kind of a turn's items is drawn: text, reasoning, tool cards, plans, approvals,
// clarify forms, steers and errors (TurnView, transcript.js, owns the state and the redraws).

import { h, humanize, pretty } from './dom.js';
import { renderDiff } from './diff.js';
import { renderFilesRestored } from './changes.js';
import { renderTerminal } from './terminal.js';

// A tool's text longer than this is shown folded, with "Show all".
const FOLD_LINES = 12;
const FOLD_CHARS = 2400;

// Glyphs every common font has (no emoji font is assumed).
const TOOL_ICONS = {
  read: '¶',
  edit: '✎',
  delete: '✕',
  move: '⇄',
  search: '⌕',
  execute: '▶',
  think: '…',
  fetch: '↓',
  switch_mode: '⇄',
  other: '•',
};

export const RENDERERS = {
  text: (item, view) => {
    // A turn that was already settled when it was drawn gets the server's rendering in the same
    // task (loadTranscript) or right after: rendering it here too would be wasted on a long session.
    // So is a text already followed by something else (a turn loaded mid-way, a replay): only
    // the text still streaming renders now.
    const streaming = !view.terminal && view.state.items[view.state.items.length - 1] === item;
    if (view.settledAtStart || !streaming) return view.drawLazily(item);
    const node = h('div', { class: 'md live' });
    view.renderLive(item, node);
    return node;
  },
  reasoning: (item) =>
    h(
      'details',
      { class: 'reasoning', dataset: { key: `r:${item.reasoning_id}`, done: String(!!item.done) } },
      h('summary', { text: item.done ? 'Thought' : 'Thinking…' }),
      h('div', { class: 'reasoning-text', text: item.text }),
    ),
  tool: renderTool,
  plan: renderPlan,
  approval: renderApproval,
  clarify: renderClarify,
  steer: (item) =>
    h(
      'div',
      { class: 'control-event', role: 'note' },
      h('span', { class: 'control-label', text: 'Steer' }),
      h('span', { class: 'control-text', text: item.text }),
      h('span', { class: 'control-state', text: 'delivered' }),
    ),
  // Files rewound or restored: a workspace run's one item (docs/workspace.md).
  files_restored: (item) => renderFilesRestored(item),
  // A run's final error is what its banner says; shown once, there.
  error: (item) =>
    item.terminal
      ? h('div', { class: 'item-error-final', hidden: true, text: item.message || '' })
      : h(
          'div',
          { class: 'item-error-box', role: 'alert' },
          h('strong', { text: item.code ? `Error (${item.code})` : 'Error' }),
          ' ',
          h('span', { text: item.message || '' }),
        ),
};

// A long text folds to its first lines, with "Show all" (the whole text is one click away).
function foldedText(text, key, item, view, props = {}) {
  const lines = text.split('\n');
  const long = lines.length > FOLD_LINES + 4 || text.length > FOLD_CHARS + 400;
  if (!long) return h('pre', { ...props, text });
  const open = view.isOpen(key);
  let shown = text;
  if (!open) {
    shown = lines.slice(0, FOLD_LINES).join('\n');
    if (shown.length > FOLD_CHARS) shown = shown.slice(0, FOLD_CHARS);
    shown += '\n…';
  }
  return h(
    'div',
    { class: 'folded', dataset: { folded: String(!open) } },
    h('pre', { ...props, text: shown }),
    h('button', {
      type: 'button',
      class: 'btn link small fold-toggle',
      'aria-expanded': String(open),
      dataset: { foldKey: key },
      text: open ? 'Show less' : `Show all (${lines.length} lines)`,
      onclick: () => view.toggle(key, item),
    }),
  );
}

function renderToolContent(item, view, prefix) {
  const folds = { isOpen: (key) => view.isOpen(key), toggle: (key) => view.toggle(key, item) };
  return (item.content || []).map((block, index) => {
    if (block.type === 'diff') return renderDiff(block, folds);
    if (block.type === 'text') return foldedText(block.text || '', `${prefix}:text:${index}`, item, view, { class: 'tool-text' });
    if (block.type === 'terminal') return renderTerminal(block.terminal_id, view.state.terminals?.[block.terminal_id]);
    return null;
  });
}

function renderTool(item, view) {
  const key = item.tool_call_id;
  const hasArgs = item.arguments !== undefined && item.arguments !== null;
  const hasOutput = item.output !== undefined && item.output !== null && item.output !== '';
  const duration = typeof item.duration === 'number' ? `${item.duration.toFixed(item.duration < 10 ? 1 : 0)}s` : '';
  return h(
    'div',
    { class: 'tool-card', dataset: { status: item.status || '', toolKind: item.tool_kind || 'other' } },
    h(
      'div',
      { class: 'tool-head' },
      h('span', { class: 'tool-icon', 'aria-hidden': 'true', text: TOOL_ICONS[item.tool_kind] || TOOL_ICONS.other }),
      h('span', { class: 'tool-title', text: item.title || item.tool_call_id || 'Tool call' }),
      item.tool_kind ? h('span', { class: 'badge tool-kind', text: item.tool_kind }) : null,
      h('span', { class: `badge tool-status status-${item.status || 'pending'}`, text: humanize(item.status || 'pending') }),
      duration ? h('span', { class: 'tool-duration', text: duration }) : null,
    ),
    hasArgs
      ? h('details', { class: 'tool-args', dataset: { key: `args:${key}` } }, h('summary', { text: 'Arguments' }), h('pre', { text: pretty(item.arguments) }))
      : null,
    h('div', { class: 'tool-content' }, renderToolContent(item, view, `tool:${key}`)),
    hasOutput
      ? h('details', { class: 'tool-output', dataset: { key: `out:${key}` } }, h('summary', { text: 'Output' }), foldedText(pretty(item.output), `out:${key}`, item, view))
      : null,
  );
}

const PLAN_MARKS = { completed: '✓', in_progress: '◐', pending: '○' };

function renderPlan(item, view) {
  const entries = item.entries || [];
  const done = entries.filter((e) => e.status === 'completed').length;
  const latest = view.state.items.findLast((i) => i.kind === 'plan') === item;
  if (!latest) {
    // Superseded by a later update: the latest plan card carries the whole checklist.
    return h('div', { class: 'plan-superseded', hidden: true });
  }
  return h(
    'div',
    { class: 'plan' },
    h('div', { class: 'plan-head' }, h('strong', { text: 'Plan' }), h('span', { class: 'plan-count', text: `${done}/${entries.length}` })),
    h(
      'ul',
      { class: 'checklist' },
      entries.map((entry) =>
        h(
          'li',
          { dataset: { status: entry.status || 'pending' } },
          h('span', { class: 'mark', 'aria-hidden': 'true', text: PLAN_MARKS[entry.status] || '○' }),
          h('span', { class: 'entry', text: entry.content || '' }),
          h('span', { class: 'visually-hidden', text: ` (${humanize(entry.status || 'pending')})` }),
          entry.priority && entry.priority !== 'medium' ? h('span', { class: `badge priority-${entry.priority}`, text: entry.priority }) : null,
        ),
      ),
    ),
  );
}

function renderApproval(item, view) {
  const key = `approval:${item.approval_id}`;
  const open = !item.resolved && !view.terminal;
  const chosen = (item.options || []).find((o) => o.option_id === item.choice);
  let state = 'pending';
  let result = null;
  if (item.resolved) {
    state = chosen && chosen.kind?.startsWith('reject') ? 'denied' : item.outcome === 'cancelled' ? 'cancelled' : 'resolved';
    result = chosen ? `Answered: ${chosen.name}` : `Resolved (${humanize(item.outcome || 'no choice')})`;
  } else if (view.terminal) {
    state = 'expired';
    result = 'No longer waiting: the run ended.';
  }
  const busy = view.busy.has(key);
  const message = view.controlMessages.get(key);
  return h(
    'div',
    { class: 'approval-card', dataset: { state, approvalId: item.approval_id }, role: open ? 'group' : null, 'aria-label': 'Approval request' },
    h(
      'div',
      { class: 'approval-head' },
      h('span', { class: 'approval-label', text: open ? 'Approval needed' : 'Approval' }),
      h('span', { class: 'approval-title', text: item.title || 'Permission requested' }),
      item.tool_kind ? h('span', { class: 'badge', text: item.tool_kind }) : null,
    ),
    item.arguments !== undefined && item.arguments !== null
      ? h('details', { class: 'tool-args', dataset: { key: `args:${key}` } }, h('summary', { text: 'Arguments' }), h('pre', { text: pretty(item.arguments) }))
      : null,
    h('div', { class: 'tool-content' }, renderToolContent(item, view, key)),
    open
      ? h(
          'div',
          { class: 'approval-options' },
          (item.options || []).map((option, index) =>
            h('button', {
              type: 'button',
              class: `btn option option-${(option.kind || '').startsWith('reject') ? 'reject' : 'allow'}`,
              // The key map answers with digits; the hint is drawn by CSS and is not part of the name.
              'aria-keyshortcuts': index < 9 ? String(index + 1) : null,
              dataset: { optionId: option.option_id, kind: option.kind || '', key: index < 9 ? String(index + 1) : '' },
              disabled: busy,
              text: option.name || option.option_id,
              onclick: () => view.handlers.approve(view, item, option),
            }),
          ),
        )
      : null,
    result ? h('div', { class: 'approval-result', text: result }) : null,
    open && message ? h('div', { class: 'control-message', role: 'status', text: message }) : null,
  );
}

function schemaFields(schema) {
  const properties = schema && typeof schema === 'object' ? schema.properties || {} : {};
  const required = new Set(Array.isArray(schema?.required) ? schema.required : []);
  return Object.entries(properties).map(([name, prop]) => ({ name, prop: prop || {}, required: required.has(name) }));
}

function fieldInput(field, id) {
  const { name, prop, required } = field;
  const type = Array.isArray(prop.type) ? prop.type.find((t) => t !== 'null') : prop.type;
  const common = { id, name, required };
  if (Array.isArray(prop.enum) || Array.isArray(prop.oneOf)) {
    const choices = prop.enum
      ? prop.enum.map((value) => ({ value, label: String(value) }))
      : prop.oneOf.map((o) => ({ value: o.const, label: o.title || String(o.const) }));
    return h(
      'select',
      common,
      required ? null : h('option', { value: '', text: '—' }),
      choices.map((c) => h('option', { value: String(c.value), text: c.label, selected: prop.default === c.value ? true : null })),
    );
  }
  if (type === 'boolean') return h('input', { ...common, type: 'checkbox', required: false, checked: prop.default === true });
  if (type === 'number' || type === 'integer') {
    return h('input', {
      ...common,
      type: 'number',
      step: type === 'integer' ? '1' : 'any',
      min: prop.minimum,
      max: prop.maximum,
      value: prop.default !== undefined ? String(prop.default) : null,
    });
  }
  const long = (prop.maxLength ?? 0) > 200 || prop.format === 'textarea' || prop['x-multiline'];
  const inputType = { email: 'email', uri: 'url', date: 'date', 'date-time': 'datetime-local' }[prop.format] || 'text';
  const attrs = { ...common, maxlength: prop.maxLength, minlength: prop.minLength, placeholder: prop.examples?.[0] ?? null };
  if (long) return h('textarea', { ...attrs, rows: 3, value: prop.default ?? '' });
  return h('input', { ...attrs, type: inputType, value: prop.default ?? '', autocomplete: 'off' });
}

function readForm(form, fields) {
  const answer = {};
  for (const { name, prop } of fields) {
    const input = form.elements.namedItem(name);
    if (!input) continue;
    const type = Array.isArray(prop.type) ? prop.type.find((t) => t !== 'null') : prop.type;
    if (type === 'boolean') answer[name] = input.checked;
    else if (type === 'number' || type === 'integer') {
      if (input.value !== '') answer[name] = Number(input.value);
    } else if (input.value !== '' || !prop.enum) answer[name] = input.value;
  }
  return answer;
}

function describeAnswer(answer) {
  if (answer === null || answer === undefined) return '';
  if (typeof answer !== 'object') return String(answer);
  return Object.entries(answer)
    .map(([k, v]) => `${k}: ${typeof v === 'object' ? JSON.stringify(v) : v}`)
    .join(', ');
}

function renderClarify(item, view) {
  const key = `clarify:${item.clarify_id}`;
  const open = !item.resolved && !view.terminal;
  const fields = schemaFields(item.schema);
  const busy = view.busy.has(key);
  const message = view.controlMessages.get(key);
  let result = null;
  if (item.resolved) {
    const given = describeAnswer(item.answer);
    result = given ? `Answered: ${given}` : `Closed (${humanize(item.outcome || 'no answer')})`;
  } else if (view.terminal) {
    result = 'No longer waiting: the run ended.';
  }
  const prefix = `clarify-${view.runId}-${String(item.clarify_id).replace(/[^A-Za-z0-9_-]/g, '_')}`;
  const body = [];
  if (open) {
    if (fields.length) {
      for (const field of fields) {
        const id = `${prefix}-${field.name.replace(/[^A-Za-z0-9_-]/g, '_')}`;
        body.push(
          h(
            'div',
            { class: 'field' },
            h('label', { for: id, text: `${field.prop.title || field.name}${field.required ? ' *' : ''}` }),
            field.prop.description ? h('div', { class: 'hint', text: field.prop.description }) : null,
            fieldInput(field, id),
          ),
        );
      }
    } else {
      body.push(h('div', { class: 'field' }, h('textarea', { name: '__text', rows: 3, required: true, 'aria-label': 'Your answer' })));
    }
    body.push(h('div', { class: 'clarify-actions' }, h('button', { type: 'submit', class: 'btn primary', disabled: busy, text: 'Answer' })));
  }
  const form = h(
    'form',
    {
      class: 'clarify-card',
      dataset: { clarifyId: item.clarify_id, resolved: String(!!item.resolved), state: open ? 'open' : 'closed' },
      onsubmit: (event) => {
        event.preventDefault();
        if (!open) return;
        const answer = fields.length ? readForm(event.currentTarget, fields) : event.currentTarget.elements.namedItem('__text').value;
        view.handlers.clarify(view, item, answer);
      },
    },
    h('div', { class: 'clarify-head' }, h('span', { class: 'approval-label', text: open ? 'Question' : 'Question answered' })),
    h('p', { class: 'clarify-question', text: item.question || '' }),
    body,
    result ? h('div', { class: 'approval-result', text: result }) : null,
    message ? h('div', { class: 'control-message', role: 'status', text: message }) : null,
  );
  return form;
}
