// Worktree sessions (docs/worktrees.md): a session in its own git worktree, on its own branch.
// Here: "New session in its own worktree" (branch and base), the branch badge with ahead/behind
// in the header and the sidebar, and Merge and Discard with their results and conflicts.

import { ApiError, NetworkError, csrfToken } from './api.js';
import { alertDialog, formDialog } from './dialogs.js';
import { h, uuid } from './dom.js';

async function call(method, path, body) {
  const headers = { Accept: 'application/json', 'X-CSRFToken': csrfToken() };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let response;
  try {
    response = await fetch(`/api${path}`, { method, headers, credentials: 'same-origin', body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (error) {
    throw new NetworkError(error);
  }
  const data = await response.json().catch(() => null);
  if (!response.ok) throw new ApiError(response.status, data?.code || `http_${response.status}`, data?.message || response.statusText, data?.details);
  return data;
}

export const worktreeApi = {
  create: (projectId, body) => call('POST', `/projects/${projectId}/sessions`, { worktree: true, ...body }),
  session: (id) => call('GET', `/sessions/${id}`),
  merge: (id, body) => call('POST', `/sessions/${id}/worktree/merge`, body),
  discard: (id, deleteBranch) => call('DELETE', `/sessions/${id}/worktree${deleteBranch ? '?delete_branch=true' : ''}`),
};

function describe(w) {
  const parts = [`Branch ${w.branch} from ${w.base}`];
  if (w.state === 'pending') parts.push('made before the first turn');
  if (w.state === 'discarded') parts.push('worktree discarded');
  if (w.state === 'archived') parts.push('worktree removed with the archive; restored on the next turn');
  parts.push(`${w.ahead} ahead, ${w.behind} behind`);
  if (w.dirty) parts.push('uncommitted changes');
  if (w.error) parts.push(`problem: ${w.error}`);
  return parts.join(' · ');
}

// The branch badge: "⎇ fix/typo ↑2 ↓1 •" (• uncommitted work); null for a plain session.
export function worktreeBadge(session) {
  const w = session?.worktree;
  if (!w) return null;
  const counts = [w.ahead ? `↑${w.ahead}` : '', w.behind ? `↓${w.behind}` : '', w.dirty ? '•' : ''].filter(Boolean).join(' ');
  const broken = w.error || w.state === 'discarded';
  return h(
    'span',
    { class: `worktree-badge${broken ? ' broken' : ''}`, title: describe(w), 'aria-label': describe(w), dataset: { role: 'worktree-badge', state: w.state } },
    h('span', { class: 'branch', text: `⎇ ${w.branch}` }),
    counts ? h('span', { class: 'counts', text: counts }) : null,
  );
}

// A result said plainly (alertDialog's title is for failures).
function noticeDialog(title, message) {
  const dialog = formDialog(title, [h('p', { text: message, dataset: { role: 'worktree-notice' } })], 'OK', async () => true);
  dialog.querySelector('button[value=cancel]').remove();
  dialog.showModal();
}

function field(label, input, hint) {
  return h('label', { class: 'field' }, h('span', { text: label }), input, hint ? h('small', { class: 'hint', text: hint }) : null, h('span', { class: 'form-error', role: 'alert' }));
}

// "New session in its own worktree": branch and base, both optional.
export function newWorktreeSessionDialog(project) {
  const branch = h('input', { name: 'branch', maxlength: '200', spellcheck: 'false', autocomplete: 'off', placeholder: 'hermesweb/session-<id>' });
  const base = h('input', { name: 'base', maxlength: '200', spellcheck: 'false', autocomplete: 'off', placeholder: 'the current branch' });
  const dialog = formDialog(
    'New session in its own worktree',
    [
      h('p', { class: 'dialog-note', text: `A git worktree of ${project.name} on a new branch: this session's agent works there, and the main checkout changes only when you merge.` }),
      field('Branch', branch, 'A new branch name; empty for one made up.'),
      field('Base', base, 'The branch to start from and merge back into.'),
    ],
    'Start session',
    async (form) => {
      try {
        const session = await worktreeApi.create(project.id, { branch: branch.value.trim(), base: base.value.trim() });
        location.assign(`/sessions/${session.id}/`);
        return true;
      } catch (error) {
        const target = error.code === 'invalid_base' ? base : branch;
        target.closest('label').querySelector('.form-error').textContent = error.message;
        return false;
      }
    },
  );
  dialog.showModal();
  return dialog;
}

// The launch dialog's part (manage.js): "New session in its own worktree", with its branch.
export function worktreeLaunchFields() {
  const on = h('input', { type: 'checkbox', name: 'worktree', dataset: { role: 'launch-worktree' } });
  const branch = h('input', { name: 'worktree_branch', maxlength: '200', spellcheck: 'false', autocomplete: 'off', placeholder: 'a new branch (empty: made up)', 'aria-label': 'Branch of the new worktree' });
  const row = h('span', { class: 'worktree-launch-branch', hidden: true }, branch);
  on.addEventListener('change', () => (row.hidden = !on.checked));
  const nodes = h('div', { class: 'worktree-launch' }, h('label', { class: 'check' }, on, h('span', { text: ' New session in its own worktree' })), row);
  return { nodes, body: () => (on.checked ? { worktree: true, branch: branch.value.trim() } : {}) };
}

function mergeDialog(session, onDone) {
  const w = session.worktree;
  const strategy = h('select', { name: 'strategy' }, ['merge', 'squash', 'rebase'].map((s) => h('option', { value: s, text: s === 'merge' ? 'Merge (fast-forward when it can)' : s === 'squash' ? 'Squash into one commit' : 'Rebase onto the base' })));
  const message = h('textarea', { name: 'message', rows: '3', maxlength: '10000', placeholder: `Work from ${w.branch}` });
  const outcome = h('div', { class: 'worktree-outcome', role: 'status', dataset: { role: 'merge-outcome' } });
  const clientId = uuid();
  const dialog = formDialog(
    `Merge ${w.branch} into ${w.base}`,
    [
      h('p', { class: 'dialog-note', text: `${w.dirty ? 'Uncommitted work in the worktree is committed first, as you. ' : ''}Nothing changes if the merge conflicts or the main checkout has uncommitted changes to the same files.` }),
      field('Strategy', strategy),
      field('Message', message),
      outcome,
    ],
    'Merge',
    async () => {
      outcome.replaceChildren();
      outcome.className = 'worktree-outcome';
      try {
        const done = await worktreeApi.merge(session.id, { strategy: strategy.value, message: message.value, client_id: clientId });
        onDone();
        noticeDialog('Merged', `Merged ${w.branch} into ${w.base}: ${w.base} is now at ${done.commit.slice(0, 10)}.`);
        return true;
      } catch (error) {
        outcome.classList.add('refused');
        const paths = error.details?.paths || [];
        const title = { merge_conflict: 'Conflicts — nothing was merged, nothing changed:', base_dirty: `The main checkout has uncommitted changes to these files — nothing changed:`, session_busy: 'A turn is running; merge when it has ended.' }[error.code] || error.message;
        outcome.append(h('strong', { text: title }), paths.length ? h('ul', { class: 'paths' }, paths.map((p) => h('li', null, h('code', { text: p })))) : null);
        return false;
      }
    },
  );
  dialog.showModal();
  return dialog;
}

function discardDialog(session, onDone) {
  const w = session.worktree;
  const drop = h('input', { type: 'checkbox', name: 'delete_branch' });
  const dialog = formDialog(
    `Discard the worktree of ${w.branch}?`,
    [
      h('p', { text: 'The worktree and its uncommitted work are removed; this session cannot run turns afterwards.' }),
      h('label', { class: 'check' }, drop, h('span', { text: ` Delete the branch ${w.branch} too` })),
    ],
    'Discard',
    async () => {
      try {
        const done = await worktreeApi.discard(session.id, drop.checked);
        onDone();
        noticeDialog('Discarded', `Discarded the worktree${done.branch_deleted ? ` and the branch ${w.branch}` : `; the branch ${w.branch} stays`}.`);
        return true;
      } catch (error) {
        alertDialog(error.code === 'session_busy' ? 'A turn is running; discard when it has ended.' : `Could not discard: ${error.message}`);
        return true;
      }
    },
  );
  dialog.showModal();
  return dialog;
}

// The session page's header: the badge, Merge and Discard.
export async function installWorktreeHeader(sessionId) {
  const title = document.querySelector('[data-role="title"]');
  const tools = document.querySelector('.topbar-tools');
  if (!title || !tools) return;
  const slot = h('span', { class: 'worktree-header', dataset: { role: 'worktree' } });
  title.after(slot);
  let shown = null;
  const refresh = async () => {
    let session;
    try {
      session = await worktreeApi.session(sessionId);
    } catch {
      return;
    }
    // Redrawn only when something changed: an open menu or a pointer on a button stays put.
    const key = JSON.stringify(session.worktree);
    if (key === shown) return;
    shown = key;
    slot.replaceChildren();
    if (!session.worktree) return;
    const live = session.worktree.state === 'ready';
    slot.append(
      worktreeBadge(session),
      h('button', { type: 'button', class: 'btn small', dataset: { role: 'worktree-merge' }, text: 'Merge', disabled: !live, title: `Merge ${session.worktree.branch} into ${session.worktree.base}`, onclick: () => mergeDialog(session, refresh) }),
      h('button', { type: 'button', class: 'btn small', dataset: { role: 'worktree-discard' }, text: 'Discard', disabled: session.worktree.state === 'discarded', title: 'Remove the worktree', onclick: () => discardDialog(session, refresh) }),
    );
  };
  await refresh();
  // A turn changes the counts: look again when the page's run status changes, and on focus.
  const workbench = document.getElementById('workbench');
  if (workbench) new MutationObserver(refresh).observe(workbench, { attributes: true, attributeFilter: ['data-run-status'] });
  window.addEventListener('focus', refresh);
}

const data = JSON.parse(document.getElementById('workbench-data')?.textContent || 'null');
if (data?.session) installWorktreeHeader(data.session.id);
