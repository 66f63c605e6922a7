// The git panel at the top of the Files panel (docs/workspace.md, "Git"): the project's branch
// and dirty files, each with a tick box, and "Commit…" of the ticked ones with a message (the
// author is the user). Nothing is pushed. A commit carries a client id: a retried click is the
// same commit, never a second one. Hidden when the project is not a git repository.

import { csrfToken, ApiError } from './api.js';
import { h, clear, uuid } from './dom.js';

const STATES = { M: 'modified', A: 'added', D: 'deleted', T: 'type changed', U: 'conflicted', '?': 'untracked', R: 'renamed' };

async function call(method, url, body) {
  const response = await fetch(url, {
    method,
    credentials: 'same-origin',
    headers: { 'X-CSRFToken': csrfToken(), ...(body ? { 'Content-Type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  let data = null;
  try { data = await response.json(); } catch { data = null; }
  if (!response.ok) throw new ApiError(response.status, data?.code || `http_${response.status}`, data?.message || response.statusText, data?.details);
  return data;
}

function describe(file) {
  const letter = file.worktree !== ' ' ? file.worktree : file.index;
  return STATES[letter] || letter;
}

export class GitPanel {
  constructor(project, onCommitted, sessionId = null) {
    this.project = project;
    // A worktree session's panel shows its worktree's branch and commits there (docs/worktrees.md).
    this.query = sessionId ? `?session=${encodeURIComponent(sessionId)}` : '';
    this.onCommitted = onCommitted;
    this.element = h('section', { class: 'git-panel', 'data-role': 'git-panel', 'aria-label': 'Git', hidden: true });
    this.pending = null; // {client_id, message, paths}: one commit, retried as the same
  }

  async load() {
    let state;
    try {
      state = await call('GET', `/api/projects/${this.project.id}/git${this.query}`);
    } catch {
      this.element.hidden = true;
      return;
    }
    this.element.hidden = !state.repository;
    if (state.repository) this.show(state);
  }

  show(state) {
    clear(this.element);
    const branch = state.branch || (state.head ? `detached at ${state.head.slice(0, 8)}` : 'no commits yet');
    const commit = h('button', { type: 'button', class: 'btn small', 'data-role': 'git-commit', text: 'Commit…', disabled: true });
    const list = h('ul', { class: 'git-files', 'data-role': 'git-files' });
    const boxes = [];
    for (const file of state.files) {
      const box = h('input', { type: 'checkbox', value: file.path, 'aria-label': `Commit ${file.path}` });
      box.addEventListener('change', () => { commit.disabled = !boxes.some((b) => b.checked); });
      boxes.push(box);
      list.append(h('li', {}, h('label', { class: 'git-file' }, box,
        h('span', { class: 'git-path', title: file.path, text: file.path }),
        h('span', { class: `git-state muted`, text: describe(file) }))));
    }
    const summary = state.files.length ? `${state.files.length} changed file${state.files.length === 1 ? '' : 's'}` : 'clean';
    this.element.append(
      h('div', { class: 'git-head' },
        h('span', { class: 'git-branch', 'data-role': 'git-branch', title: 'Branch', text: `⎇ ${branch}` }),
        h('span', { class: 'muted', text: summary }),
        commit),
      state.files.length ? list : null,
    );
    commit.addEventListener('click', () => this.compose(boxes.filter((b) => b.checked).map((b) => b.value)));
  }

  compose(paths) {
    const message = h('textarea', { class: 'git-message', 'data-role': 'git-message', rows: 3, 'aria-label': 'Commit message', placeholder: 'What this commit does' });
    const ok = h('button', { type: 'submit', class: 'btn primary small', 'data-role': 'git-commit-confirm', text: `Commit ${paths.length} file${paths.length === 1 ? '' : 's'}` });
    const cancel = h('button', { type: 'button', class: 'btn small', text: 'Cancel' });
    const error = h('p', { class: 'files-note error', role: 'alert', hidden: true });
    const form = h('form', { class: 'git-compose', 'data-role': 'git-compose' },
      h('p', { class: 'muted', text: `Author: you. No push. ${paths.join(', ')}` }), message, error,
      h('span', { class: 'files-actions' }, cancel, ok));
    this.element.append(form);
    message.focus();
    cancel.addEventListener('click', () => form.remove());
    form.addEventListener('submit', async (event) => {
      event.preventDefault();
      const text = message.value.trim();
      if (!text) { message.focus(); return; }
      const same = this.pending && this.pending.message === text && this.pending.paths.join('\0') === paths.join('\0');
      if (!same) this.pending = { client_id: uuid(), message: text, paths };
      ok.disabled = true;
      try {
        const answer = await call('POST', `/api/projects/${this.project.id}/git/commit${this.query}`, this.pending);
        this.pending = null;
        this.lastCommit = answer.commit;
        this.element.dataset.lastCommit = answer.commit;
        this.onCommitted?.();
      } catch (failure) {
        ok.disabled = false;
        error.hidden = false;
        error.textContent = failure.code === 'nothing_to_commit' ? 'Those files are as the last commit has them.' : `Not committed: ${failure.message}`;
        if (failure.status && failure.status < 500) this.pending = null; // refused: a new try is a new commit
      }
    });
  }
}
