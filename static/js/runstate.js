// A run's materialized state, folded from its events.
//
// This is a line-by-line port of runs/transcript.py `materialize`/`apply_event`,
// so a state loaded from GET /api/sessions/{id}/transcript can keep being fed
// live events, and item indexes match the server's (the rendered-markdown
// fragments are keyed by them). Change both together.

export const TERMINAL_STATES = new Set(['completed', 'cancelled', 'failed', 'interrupted']);
export const ACTIVE_STATUSES = new Set(['queued', 'running', 'awaiting_approval', 'awaiting_clarify', 'cancelling']);

export function emptyState() {
  return {
    items: [],
    text: '',
    reasoning: '',
    tools: {},
    plan: [],
    approvals: {},
    clarifications: {},
    steers: [],
    title: null,
    usage: {},
    usage_final: null,
    errors: [],
    status: 'queued',
    terminal: false,
    terminal_state: null,
    stop_reason: null,
    last_seq: 0,
  };
}

// A state that came over JSON has copies where the server had shared objects:
// point the id maps back at the items so updates land in what is rendered.
// A transcript page's state has no `text` or `reasoning` (runs/transcript.py `page_state`): here
// they hold only what was applied since; the page renders `items`.
export function relink(state) {
  const s = { ...emptyState(), ...state };
  s.tools = {};
  s.approvals = {};
  s.clarifications = {};
  indexItems(s, s.items);
  return s;
}

// The state's indexes of its items by id (tools, approvals, clarifications), for `items`.
export function indexItems(state, items) {
  for (const item of items) {
    if (item.kind === 'tool') state.tools[item.tool_call_id] = item;
    else if (item.kind === 'approval') state.approvals[item.approval_id] = item;
    else if (item.kind === 'clarify') state.clarifications[item.clarify_id] = item;
  }
}

// The tool card whose content shows the terminal `id` (re-rendered as it prints), if any yet.
function toolShowing(state, id) {
  return Object.values(state.tools).find((t) => (t.content || []).some((c) => c.type === 'terminal' && c.terminal_id === id));
}

const isSet = (v) => v !== undefined && v !== null;
const TOOL_KEYS = ['title', 'tool_kind', 'status', 'arguments', 'locations', 'output', 'error', 'duration'];

// Applies one event. Returns {item, created} for the item it touched, {} for
// a run-level change, or null when the event was already applied (seq at or
// below the cursor: a replay overlap), so callers can dedupe by (run_id, seq).
export function applyEvent(state, ev) {
  if (ev.seq <= state.last_seq) return null;
  state.last_seq = ev.seq;
  const kind = ev.type;
  const payload = ev.payload || {};
  const items = state.items;
  const last = items.length ? items[items.length - 1] : null;
  switch (kind) {
    case 'token.delta': {
      const delta = payload.delta || '';
      state.text += delta;
      const messageId = payload.message_id ?? null;
      if (last && last.kind === 'text' && (last.message_id ?? null) === messageId) {
        last.text += delta;
        return { item: last, created: false };
      }
      const item = { kind: 'text', message_id: messageId, text: delta };
      items.push(item);
      return { item, created: true };
    }
    case 'reasoning.delta': {
      const delta = payload.delta || '';
      state.reasoning += delta;
      const blockId = payload.reasoning_id ?? null;
      if (last && last.kind === 'reasoning' && (last.reasoning_id ?? null) === blockId && !last.done) {
        last.text += delta;
        return { item: last, created: false };
      }
      const item = { kind: 'reasoning', reasoning_id: blockId, text: delta, done: false };
      items.push(item);
      return { item, created: true };
    }
    case 'reasoning.done': {
      for (let i = items.length - 1; i >= 0; i--) {
        if (items[i].kind === 'reasoning') {
          items[i].done = true;
          return { item: items[i], created: false };
        }
      }
      return {};
    }
    case 'tool.started':
    case 'tool.updated':
    case 'tool.done': {
      const toolId = payload.tool_call_id || '';
      let tool = state.tools[toolId];
      let created = false;
      if (!tool) {
        tool = { kind: 'tool', tool_call_id: toolId, status: 'pending', content: [] };
        state.tools[toolId] = tool;
        items.push(tool);
        created = true;
      }
      for (const key of TOOL_KEYS) if (isSet(payload[key])) tool[key] = payload[key];
      if (Array.isArray(payload.content) && payload.content.length) tool.content = payload.content;
      if (kind === 'tool.done') tool.done = true;
      return { item: tool, created };
    }
    case 'plan.updated': {
      state.plan = payload.entries || [];
      if (last && last.kind === 'plan') {
        last.entries = state.plan;
        return { item: last, created: false };
      }
      const item = { kind: 'plan', entries: state.plan };
      items.push(item);
      return { item, created: true };
    }
    case 'approval.requested': {
      const item = { kind: 'approval', ...payload, resolved: false, choice: null };
      state.approvals[payload.approval_id] = item;
      items.push(item);
      return { item, created: true };
    }
    case 'approval.resolved': {
      const item = state.approvals[payload.approval_id];
      if (!item) return {};
      Object.assign(item, { resolved: true, choice: payload.option_id ?? null, outcome: payload.outcome ?? null });
      return { item, created: false };
    }
    case 'clarify.requested': {
      const item = { kind: 'clarify', ...payload, resolved: false, answer: null };
      state.clarifications[payload.clarify_id] = item;
      items.push(item);
      return { item, created: true };
    }
    case 'clarify.resolved': {
      const item = state.clarifications[payload.clarify_id];
      if (!item) return {};
      Object.assign(item, { resolved: true, answer: payload.answer ?? null, outcome: payload.outcome ?? null });
      return { item, created: false };
    }
    case 'steer.delivered': {
      const item = { kind: 'steer', text: payload.text || '', intent_id: payload.intent_id ?? null };
      state.steers.push(item);
      items.push(item);
      return { item, created: true };
    }
    case 'title.updated':
      state.title = payload.title ?? null;
      return {};
    case 'usage.updated':
      state.usage = { ...state.usage, ...payload };
      return {};
    case 'usage.final':
      state.usage_final = payload;
      return {};
    case 'terminal.output': {
      const id = payload.terminal_id ?? '';
      // An ACP terminal's id → what it printed (its tool card shows it); made by the first.
      const terminals = (state.terminals ??= {});
      terminals[id] = (terminals[id] ?? '') + (payload.delta ?? '');
      return { item: toolShowing(state, id), created: false };
    }
    case 'error': {
      state.errors.push(payload);
      const item = { kind: 'error', ...payload };
      items.push(item);
      return { item, created: true };
    }
    case 'files.restored': {
      const item = { kind: 'files_restored', ...payload };
      items.push(item);
      return { item, created: true };
    }
    case 'status':
    case 'run.started':
      if (payload.status) state.status = payload.status;
      return {};
    case 'progress':
      state.progress = payload.text ?? null;
      return {};
    case 'done':
      state.terminal = true;
      state.terminal_state = payload.state ?? null;
      state.status = payload.state ?? null;
      state.stop_reason = payload.stop_reason ?? null;
      if (payload.reason) state.terminal_reason = payload.reason;
      return {};
    default:
      return {};
  }
}
