// Importing the agent's own sessions into a project (docs/operations.md, "Session discovery
// and import"). The web process runs no agent: discovery and import are agent jobs a runner
// carries out. The dialog starts one, follows GET /api/jobs/{id} and shows its state as it goes
// (pending → running → done | failed, with the job's error in words), then opens the session.

import { api, NetworkError } from './api.js';
import { h } from './dom.js';

const POLL_FIRST_MS = 250;
const POLL_MAX_MS = 2000;

// The job's error codes (runs/discovery.py, runs/runner/jobs.py), said for a person.
const ERRORS = {
  agent_unknown: 'This project’s agent is not configured on the server.',
  project_path_refused: 'This project’s directory is no longer allowed on this server.',
  agent_start_failed: 'The agent could not be started.',
  agent_died: 'The agent stopped while it was working on this.',
  agent_timeout: 'The agent did not answer in time.',
  list_unsupported: 'This agent cannot list its sessions, so none can be imported from it.',
  load_unsupported: 'This agent cannot load a saved session, so its sessions cannot be imported.',
  list_failed: 'The agent could not list its sessions.',
  load_failed: 'The agent could not load this session.',
  empty_history: 'The agent replayed no history for this session: there is nothing to import.',
  session_busy: 'The agent is busy with this session right now.',
  runner_lost: 'The runner doing this stopped answering.',
  runner_shutdown: 'The runner doing this was shut down.',
  runner_error: 'The runner ran into an error doing this.',
};

export function errorInWords(error) {
  return ERRORS[error?.code] || 'It did not work.';
}

const DISCOVERY_STATES = {
  pending: 'Waiting for a runner to ask the agent…',
  running: 'Asking the agent for its sessions…',
};
const IMPORT_STATES = {
  pending: 'Waiting for a runner…',
  running: 'Importing the history…',
};

const when = new Intl.DateTimeFormat(undefined, { dateStyle: 'medium', timeStyle: 'short' });

function updatedAt(value) {
  const date = value ? new Date(value) : null;
  if (!date || Number.isNaN(date.getTime())) return h('span', { text: 'time unknown' });
  return h('time', { datetime: date.toISOString(), text: when.format(date) });
}

function pause(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener('abort', () => (clearTimeout(timer), resolve()), { once: true });
  });
}

// Follow a job until it is done or failed (or the dialog is closed: null). A lost answer
// (server restarting, network gone) is only a reason to ask again.
async function follow(job, onUpdate, signal) {
  let delay = POLL_FIRST_MS;
  while (job.state === 'pending' || job.state === 'running') {
    await pause(delay, signal);
    if (signal.aborted) return null;
    delay = Math.min(Math.round(delay * 1.5), POLL_MAX_MS);
    try {
      job = await api.job(job.id);
    } catch (error) {
      if (error instanceof NetworkError) continue;
      throw error;
    }
    onUpdate(job);
  }
  return job;
}

// A spinner while a job is on its way; the error in words, then the job's own message.
const busy = (state) => (state === 'pending' || state === 'running' ? [h('span', { class: 'spinner', 'aria-hidden': 'true' })] : []);
const said = (words, detail) => [h('strong', { text: words }), ...(detail ? [h('span', { class: 'detail', text: ` ${detail}` })] : [])];

let opened = 0;

export function importDialog(project) {
  const titleId = `import-title-${++opened}`;
  const aborter = new AbortController();
  const status = h('div', { class: 'job-status', role: 'status', 'aria-live': 'polite' });
  const failure = h('div', { class: 'job-error', role: 'alert' });
  const list = h('ul', { class: 'import-list', 'aria-label': `Sessions of the agent in ${project.name}` });
  const again = h('button', { type: 'button', class: 'btn', 'data-role': 'discover-again', text: 'List again', onclick: () => discover() });
  const dialog = h(
    'dialog',
    { class: 'dialog wide import-dialog', 'aria-labelledby': titleId },
    h('h2', { id: titleId, text: `Import sessions into “${project.name}”` }),
    h('p', { class: 'hint muted' }, `The ${project.agent} agent’s own sessions in `, h('code', { text: project.path }), '. An imported session keeps its history and goes on where it left off.'),
    status,
    failure,
    list,
    h('div', { class: 'dialog-actions' }, again, h('button', { type: 'button', class: 'btn', text: 'Close', onclick: () => dialog.close() })),
  );
  dialog.addEventListener('close', () => (aborter.abort(), dialog.remove()));
  document.body.append(dialog);
  dialog.showModal();

  const showStatus = (state, text) => {
    status.dataset.state = state;
    status.replaceChildren(...busy(state), h('span', { text }));
  };
  const showFailure = (words, detail) => {
    failure.replaceChildren(...said(words, detail));
  };

  let importing = false;

  async function discover() {
    again.disabled = true;
    failure.replaceChildren();
    list.replaceChildren();
    let job;
    try {
      job = await api.discover(project.id);
      showStatus(job.state, DISCOVERY_STATES[job.state] || '');
      job = await follow(job, (next) => showStatus(next.state, DISCOVERY_STATES[next.state] || ''), aborter.signal);
    } catch (error) {
      showStatus('failed', 'Could not ask the agent.');
      showFailure(error.message);
      again.disabled = false;
      return;
    }
    if (!job) return;
    again.disabled = false;
    if (job.state === 'failed') {
      showStatus('failed', 'The agent’s sessions could not be listed.');
      showFailure(errorInWords(job.error), job.error?.message);
      return;
    }
    const sessions = job.result?.sessions || [];
    const count = sessions.length === 1 ? '1 session' : `${sessions.length} sessions`;
    showStatus('done', sessions.length ? `${count} of the agent in this directory${job.result?.truncated ? ' (the most recent; the agent had more)' : ''}.` : 'The agent has no sessions in this directory.');
    list.replaceChildren(...sessions.map(row));
  }

  function row(entry) {
    const title = entry.title || `Untitled session ${entry.agent_session_id.slice(0, 8)}`;
    const progress = h('span', { class: 'import-progress', role: 'status' });
    const error = h('div', { class: 'import-error', role: 'alert' });
    const item = h(
      'li',
      { class: 'import-item', dataset: { agentSessionId: entry.agent_session_id, state: entry.session_id ? 'imported' : 'idle' } },
      h('div', { class: 'import-main' }, h('span', { class: 'import-title', text: title }), h('span', { class: 'import-meta' }, 'Updated ', updatedAt(entry.updated_at))),
      h('div', { class: 'import-side' }),
      error,
    );
    const side = item.querySelector('.import-side');
    const showState = (job) => {
      item.dataset.state = job.state;
      item.dataset.history = `${item.dataset.history ? `${item.dataset.history} ` : ''}${job.state}`;
      const text = job.state === 'done' ? `Imported${typeof job.result?.turns === 'number' ? ` (${job.result.turns} turns)` : ''}; opening…` : job.state === 'failed' ? 'Failed.' : IMPORT_STATES[job.state];
      progress.replaceChildren(...busy(job.state), h('span', { text }));
    };
    const start = async () => {
      if (importing) return;
      importing = true;
      for (const other of list.querySelectorAll('button[data-role=import]')) other.disabled = true;
      error.replaceChildren();
      let job;
      try {
        job = await api.importSession(project.id, entry.agent_session_id);
        showState(job);
        job = await follow(job, showState, aborter.signal);
      } catch (err) {
        job = { state: 'failed', error: { code: err.code, message: err.message } };
        showState(job);
      }
      importing = false;
      if (!job) return;
      if (job.state === 'done') {
        location.assign(`/sessions/${job.result.session_id}/`);
        return;
      }
      error.replaceChildren(...said(errorInWords(job.error), job.error?.message));
      for (const other of list.querySelectorAll('button[data-role=import]')) other.disabled = false;
      button.textContent = 'Try again';
      button.setAttribute('aria-label', `Try again: import ${title}`);
    };
    const button = h('button', { type: 'button', class: 'btn small primary', 'data-role': 'import', 'aria-label': `Import ${title}`, text: 'Import', onclick: start });
    if (entry.session_id) {
      side.append(h('span', { class: 'badge', text: 'In hermesweb' }), h('a', { class: 'btn small', href: `/sessions/${entry.session_id}/`, 'aria-label': `Open ${title}`, text: 'Open' }));
    } else {
      side.append(progress, button);
    }
    return item;
  }

  discover();
  return dialog;
}
