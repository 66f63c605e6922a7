// What turns changed in the project's files (docs/workspace.md): each settled turn's
// "N files changed, +a −d", its changes (file list and diffs) in a dialog, the session's Changes
// view (the header's button), and the item a rewind or restore leaves in the transcript.
//
// Installed by itself on the session page. It watches the transcript's turns (their
// `data-status`) rather than being called by TurnView: a page of turns costs one summary request,
// and a turn that settles later one more, never one per turn.

import { api, ApiError, NetworkError, toLogin } from './api.js';
import { h } from './dom.js';
import { lineRow } from './diff.js';
import { rewindTurn, undoRestore } from './rewind.js';

const SETTLED = new Set(['completed', 'cancelled', 'failed', 'interrupted']);
// A summary request names at most this many runs (the server's bound).
const BATCH = 500;

const plural = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;

// ---------------------------------------------------------------- unified diffs

// A git unified diff as rows: hunks' lines numbered from their headers, the unchanged lines
// between hunks folded into one row {gap, oldNo, newNo} (the first hidden line's numbers; their
// text is not in the diff: opening the fold asks the changes' lines route for it).
export function unifiedRows(patch) {
  const rows = [];
  let oldNo = 0;
  let newNo = 0;
  let seen = false;
  for (const raw of (patch || '').split('\n')) {
    const hunk = raw.match(/^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@/);
    if (hunk) {
      const start = Number(hunk[2]);
      const gap = seen ? start - newNo - 1 : start - 1;
      if (gap > 0) rows.push({ gap, oldNo: oldNo + 1, newNo: newNo + 1 });
      oldNo = Number(hunk[1]) - 1;
      newNo = start - 1;
      seen = true;
      continue;
    }
    if (!seen || raw.startsWith('\\')) continue; // the header lines; "\ No newline at end of file"
    const op = raw[0];
    if (op !== '+' && op !== '-' && op !== ' ') continue;
    if (op !== '+') oldNo++;
    if (op !== '-') newNo++;
    rows.push({ op, text: raw.slice(1), oldNo: op === '+' ? null : oldNo, newNo: op === '-' ? null : newNo });
  }
  return rows;
}

const STATUS_LABELS = { added: 'new file', deleted: 'deleted', modified: null };
// Lines one opened fold asks for (the server's bound); a longer fold opens a page at a time.
const FOLD_PAGE = 2000;

// `base`: the changes' API path (`/api/runs/<id>/changes` or the session's), whose `/lines`
// answers a file's lines on the newer side; none: the fold is a note that cannot open.
async function foldLines(base, path, start, count) {
  const query = new URLSearchParams({ path, start: String(start), count: String(count) });
  let response;
  try {
    response = await fetch(`${base}/lines?${query}`, { credentials: 'same-origin', headers: { Accept: 'application/json' } });
  } catch (error) {
    throw new NetworkError(error);
  }
  if (response.status === 401) toLogin();
  const data = await response.json().catch(() => null);
  if (!response.ok) throw new ApiError(response.status, data?.code || `http_${response.status}`, data?.message || response.statusText, data?.details);
  return data;
}

function foldRow(row, path, base) {
  const text = `⋯ ${plural(row.gap, 'unchanged line')}`;
  if (!base) return h('span', { class: 'line fold' }, h('span', { class: 'diff-note', text }));
  const count = Math.min(row.gap, FOLD_PAGE);
  const button = h('button', {
    type: 'button',
    class: 'fold-button',
    'aria-label': `Show ${plural(row.gap, 'unchanged line')}, ${row.newNo} to ${row.newNo + row.gap - 1}`,
    text,
  });
  const el = h('span', { class: 'line fold', dataset: { fold: String(row.newNo) } }, button);
  button.addEventListener('click', async () => {
    button.disabled = true;
    button.textContent = 'Loading…';
    try {
      const answer = await foldLines(base, path, row.newNo, count);
      const shown = answer.lines.map((line, i) => lineRow({ op: ' ', text: line, oldNo: row.oldNo + i, newNo: row.newNo + i }));
      const rest = row.gap - answer.lines.length;
      // The file changed shape since (fewer lines than the fold): show what came, no more.
      const more = rest > 0 && answer.lines.length === count ? [foldRow({ gap: rest, oldNo: row.oldNo + count, newNo: row.newNo + count }, path, base)] : [];
      el.replaceWith(...shown, ...more);
    } catch (error) {
      button.disabled = false;
      button.textContent = `${text} — could not load them (${error.message}); try again`;
    }
  });
  return el;
}

function renderFileDiff(file, index, base = null) {
  const body = h('pre', { class: 'diff-body', tabindex: '0', 'aria-label': `Diff of ${file.path}` });
  if (file.binary) body.append(h('span', { class: 'line fold' }, h('span', { class: 'diff-note', text: 'Binary file' })));
  else if (file.diff === null) body.append(h('span', { class: 'line fold' }, h('span', { class: 'diff-note', text: 'Diff too large to show' })));
  else {
    for (const row of unifiedRows(file.diff)) {
      body.append(row.gap ? foldRow(row, file.path, file.binary ? null : base) : lineRow(row));
    }
    if (file.truncated) body.append(h('span', { class: 'line fold' }, h('span', { class: 'diff-note', text: '⋯ the rest of this diff is cut' })));
  }
  const label = STATUS_LABELS[file.status];
  return h(
    'section',
    { class: 'diff changes-file', id: `changes-file-${index}`, dataset: { path: file.path } },
    h(
      'div',
      { class: 'diff-head' },
      h('span', { class: 'diff-path', title: file.path, text: file.path }),
      label ? h('span', { class: `badge status-${file.status}`, text: label }) : null,
      h('span', { class: 'diff-stat' }, h('span', { class: 'add', text: `+${file.additions}` }), ' ', h('span', { class: 'del', text: `−${file.deletions}` })),
    ),
    body,
  );
}

function stat(files, additions, deletions) {
  return [
    h('span', { class: 'changes-count', text: `${plural(files, 'file')} changed,` }),
    ' ',
    h('span', { class: 'add', text: `+${additions}` }),
    ' ',
    h('span', { class: 'del', text: `−${deletions}` }),
  ];
}

// The changes (an API answer) as a file list and diffs; `base` (the API path they came from)
// lets the folds between hunks open.
export function renderChanges(changes, base = null) {
  const files = changes.files || [];
  if (!files.length) {
    return h('p', { class: 'changes-empty', text: changes.notice || 'No files changed.' });
  }
  const additions = files.reduce((sum, f) => sum + f.additions, 0);
  const deletions = files.reduce((sum, f) => sum + f.deletions, 0);
  const list = h(
    'ul',
    { class: 'changes-list', 'aria-label': 'Files changed' },
    files.map((file, index) =>
      h(
        'li',
        {},
        h('a', { href: `#changes-file-${index}`, class: `changes-path status-${file.status}`, text: file.path, onclick: (event) => {
          event.preventDefault();
          event.currentTarget.closest('dialog')?.querySelector(`#changes-file-${index}`)?.scrollIntoView({ block: 'start' });
        } }),
        h('span', { class: 'diff-stat' }, h('span', { class: 'add', text: `+${file.additions}` }), ' ', h('span', { class: 'del', text: `−${file.deletions}` })),
      ),
    ),
  );
  return h(
    'div',
    { class: 'changes' },
    h('p', { class: 'changes-stat' }, ...stat(files.length, additions, deletions), changes.complete ? null : h('span', { class: 'badge', text: 'until now' })),
    list,
    files.map((file, index) => renderFileDiff(file, index, base)),
  );
}

// A dialog that shows `load()`'s changes once they come.
export function changesDialog(title, load, base = null) {
  const dialog = h('dialog', { class: 'dialog wide changes-dialog', 'aria-label': title });
  const content = h('div', { class: 'changes-content', 'aria-busy': 'true' }, h('p', { class: 'hint', text: 'Loading…' }));
  dialog.append(
    h('div', { class: 'changes-dialog-head' }, h('h2', { text: title }), h('button', { type: 'button', class: 'btn small', text: 'Close', onclick: () => dialog.close() })),
    content,
  );
  dialog.addEventListener('close', () => dialog.remove());
  document.body.append(dialog);
  dialog.showModal();
  load().then(
    (changes) => {
      content.replaceChildren(renderChanges(changes, base));
      content.setAttribute('aria-busy', 'false');
    },
    (error) => {
      content.replaceChildren(h('p', { class: 'form-error', role: 'alert', text: `Could not load the changes: ${error.message}` }));
      content.setAttribute('aria-busy', 'false');
    },
  );
  return dialog;
}

// ---------------------------------------------------------------- the transcript's turns

export class TurnChanges {
  constructor(sessionId, transcript) {
    this.sessionId = sessionId;
    this.transcript = transcript;
    this.summaries = new Map(); // run id → {files, additions, deletions}; settled turns' never change
    this.asked = new Set(); // run ids asked for (answered or not: a run with no checkpoints is absent)
    this.runChanges = new Map(); // run id → its changes' promise (a settled run's are final)
    this.waiting = new Set(); // turn elements added or whose status changed, not looked at yet
    // Only turns coming and going (the transcript's children) and a turn's status: a streaming
    // turn's own redraws do not wake this up.
    // Two observers: observing a node again replaces the options it was observed with.
    const note = (records) => {
      for (const record of records) {
        if (record.type === 'attributes') this.waiting.add(record.target);
        else for (const node of record.addedNodes) this.waiting.add(node);
      }
      this.schedule();
    };
    new MutationObserver(note).observe(transcript, { childList: true });
    new MutationObserver(note).observe(transcript, { subtree: true, attributes: true, attributeFilter: ['data-status'] });
    for (const el of this.turns()) this.waiting.add(el);
    this.schedule();
  }

  schedule() {
    if (this.scheduled) return;
    this.scheduled = true;
    requestAnimationFrame(() => {
      this.scheduled = false;
      const elements = [...this.waiting];
      this.waiting.clear();
      this.scan(elements.filter((el) => el.matches?.('article.turn') && el.isConnected && el.dataset.source !== 'workspace'));
    });
  }

  turns() {
    return [...this.transcript.querySelectorAll('article.turn')].filter((el) => el.dataset.source !== 'workspace');
  }

  scan(elements) {
    const wanted = [];
    for (const el of elements) {
      const runId = Number(el.dataset.runId);
      if (!SETTLED.has(el.dataset.status)) continue;
      this.decorate(el, runId);
      if (!this.asked.has(runId)) wanted.push(runId);
    }
    for (let i = 0; i < wanted.length; i += BATCH) this.fetch(wanted.slice(i, i + BATCH));
  }

  async fetch(runIds) {
    for (const id of runIds) this.asked.add(id);
    try {
      const answer = await api.changesSummary(this.sessionId, runIds);
      for (const summary of answer.runs) this.summaries.set(summary.run_id, summary);
    } catch (error) {
      for (const id of runIds) this.asked.delete(id); // asked again at the next change
      if (!(error instanceof NetworkError)) console.warn('changes summary failed', error);
      return;
    }
    for (const el of this.turns()) if (runIds.includes(Number(el.dataset.runId))) this.decorate(el, Number(el.dataset.runId));
  }

  // The turn's summary (once known) and its Rewind action, added once each.
  decorate(el, runId) {
    const actions = el.querySelector('.prompt-actions');
    if (actions && !actions.querySelector('[data-action="rewind"]')) {
      actions.append(
        h('button', {
          type: 'button',
          class: 'btn link small turn-action',
          'aria-label': 'Rewind files to before this turn',
          title: 'Rewind files to before this turn',
          dataset: { action: 'rewind' },
          text: 'Rewind files',
          onclick: () => rewindTurn(runId),
        }),
      );
    }
    const summary = this.summaries.get(runId);
    const end = el.querySelector('.turn-end');
    if (!summary || !summary.files || !end || end.querySelector('.turn-changes')) return;
    end.prepend(
      h(
        'button',
        { type: 'button', class: 'btn link small turn-changes', 'aria-label': `${plural(summary.files, 'file')} changed, ${summary.additions} lines added, ${summary.deletions} removed: show the changes`, onclick: () => this.open(runId) },
        ...stat(summary.files, summary.additions, summary.deletions),
      ),
    );
  }

  open(runId) {
    if (!this.runChanges.has(runId)) {
      const read = api.runChanges(runId);
      read.catch(() => this.runChanges.delete(runId));
      this.runChanges.set(runId, read);
    }
    return changesDialog('Changes of this turn', () => this.runChanges.get(runId), `/api/runs/${runId}/changes`);
  }
}

// ---------------------------------------------------------------- a rewind's or restore's item

export function renderFilesRestored(item) {
  const count = item.count ?? (item.paths || []).length;
  const files = plural(count, 'file');
  const text =
    item.action === 'rewind'
      ? `Files restored to before ${item.turn ? `turn ${item.turn}` : 'a turn'} — ${files}`
      : item.undid
        ? `Rewind undone — ${files} put back`
        : `Files restored — ${files}`;
  const paths = item.paths || [];
  const more = count - paths.length;
  const note = h('span', { class: 'control-message', role: 'status' });
  return h(
    'div',
    { class: 'files-restored', dataset: { undo: String(item.undo) } },
    h(
      'div',
      { class: 'files-restored-head' },
      h('span', { class: 'files-restored-icon', 'aria-hidden': 'true', text: '↺' }),
      h('strong', { text }),
      item.forced ? h('span', { class: 'badge', text: 'forced' }) : null,
      h('button', { type: 'button', class: 'btn small', text: 'Undo', 'aria-label': `Undo: ${text}`, onclick: (event) => undoRestore(item.undo, event.currentTarget, note) }),
      note,
    ),
    paths.length
      ? h(
          'details',
          { class: 'files-restored-paths' },
          h('summary', { text: 'Files' }),
          h('ul', {}, paths.map((path) => h('li', { text: path }))),
          more > 0 ? h('p', { class: 'hint', text: `and ${more} more` }) : null,
        )
      : null,
  );
}

// ---------------------------------------------------------------- installed on the session page

function install() {
  const data = JSON.parse(document.getElementById('workbench-data')?.textContent || 'null');
  const transcript = document.querySelector('[data-role="transcript"]');
  const sessionId = data?.session?.id;
  if (!sessionId || !transcript) return;
  const changes = new TurnChanges(sessionId, transcript);
  const button = document.querySelector('[data-role="changes"]');
  if (button) {
    button.hidden = false;
    button.addEventListener('click', () => changesDialog('Changes of this session', () => api.sessionChanges(sessionId), `/api/sessions/${sessionId}/changes`));
  }
  return changes;
}

export const turnChanges = install();
