// Projects and their sessions: search, rename, delete, new session, workflows, new project.

import { api, ApiError } from './api.js';
import { h, uuid } from './dom.js';

export function sessionTitle(session) {
  return session.title || `Untitled session ${session.id}`;
}

export class Sidebar {
  constructor(root, data, { currentSessionId, onDeletedCurrent }) {
    this.root = root;
    this.projects = data.projects || [];
    this.currentProjectId = data.project?.id ?? null;
    this.currentSessionId = currentSessionId;
    this.onDeletedCurrent = onDeletedCurrent;
    this.sessions = new Map();
    this.workflows = new Map();
    this.expanded = new Set();
    this.renaming = null;
    this.renameDraft = null;
    this.query = '';
    if (this.currentProjectId !== null) {
      this.sessions.set(this.currentProjectId, data.sessions || []);
      this.workflows.set(this.currentProjectId, data.workflows || []);
      this.expanded.add(this.currentProjectId);
    }
    this.list = root.querySelector('[data-role=project-list]');
    this.search = root.querySelector('[data-role=search]');
    this.search.addEventListener('input', () => {
      this.query = this.search.value.trim().toLowerCase();
      if (this.query) this.loadAll();
      this.render();
    });
    root.querySelector('[data-role=new-project]').addEventListener('click', () => this.newProjectDialog());
    this.render();
  }

  async loadAll() {
    await Promise.all(this.projects.filter((p) => !this.sessions.has(p.id)).map((p) => this.loadSessions(p.id)));
    this.render();
  }

  async loadSessions(projectId) {
    try {
      this.sessions.set(projectId, await api.sessions(projectId));
    } catch {
      this.sessions.set(projectId, this.sessions.get(projectId) || []);
    }
  }

  // The open session changed (title, active run) — keep its entry in step.
  updateSession(session) {
    const list = this.sessions.get(session.project_id);
    if (!list) return;
    const index = list.findIndex((s) => s.id === session.id);
    if (index === -1) list.unshift(session);
    else list[index] = { ...list[index], ...session };
    this.render();
  }

  render() {
    const q = this.query;
    const items = [];
    for (const project of this.projects) {
      const sessions = this.sessions.get(project.id) || [];
      const matching = q ? sessions.filter((s) => sessionTitle(s).toLowerCase().includes(q)) : sessions;
      const projectMatches = q && project.name.toLowerCase().includes(q);
      if (q && !projectMatches && !matching.length) continue;
      const open = this.expanded.has(project.id) || !!q;
      items.push(this.renderProject(project, projectMatches ? sessions : matching, open));
    }
    if (!this.projects.length) {
      items.push(h('li', { class: 'empty' }, 'No projects yet. Create one to start.'));
    } else if (!items.length) {
      items.push(h('li', { class: 'empty', text: 'Nothing matches.' }));
    }
    this.list.replaceChildren(...items);
  }

  renderProject(project, sessions, open) {
    const current = project.id === this.currentProjectId;
    const workflows = this.workflows.get(project.id) || [];
    const toggle = async () => {
      if (this.expanded.has(project.id)) this.expanded.delete(project.id);
      else {
        this.expanded.add(project.id);
        if (!this.sessions.has(project.id)) await this.loadSessions(project.id);
      }
      this.render();
    };
    return h(
      'li',
      { class: `project${current ? ' current' : ''}`, dataset: { projectId: String(project.id) } },
      h(
        'div',
        { class: 'project-row' },
        h('button', { type: 'button', class: 'disclosure', 'aria-expanded': String(open), 'aria-label': `Show sessions of ${project.name}`, text: open ? '▾' : '▸', onclick: toggle }),
        h('a', { class: 'project-name', href: `/projects/${project.id}/`, text: project.name }),
        h('button', { type: 'button', class: 'btn small', 'data-role': 'new-session', title: 'New session', text: '+ New', onclick: () => this.newSession(project) }),
      ),
      open
        ? h(
            'ul',
            { class: 'session-list' },
            sessions.length ? sessions.map((s) => this.renderSession(s)) : h('li', { class: 'empty', text: 'No sessions yet.' }),
          )
        : null,
      open && current && workflows.length
        ? h(
            'div',
            { class: 'workflows' },
            h('div', { class: 'section-label', text: 'Workflows' }),
            h(
              'ul',
              {},
              workflows.map((w) =>
                h(
                  'li',
                  { class: 'workflow', dataset: { workflowId: String(w.id) } },
                  h('span', { class: 'workflow-name', text: w.name, title: w.description || w.prompt_template }),
                  h('button', { type: 'button', class: 'btn small', 'data-role': 'launch', text: 'Launch', onclick: () => this.launchDialog(w) }),
                ),
              ),
            ),
          )
        : null,
    );
  }

  renderSession(session) {
    const current = session.id === this.currentSessionId;
    if (this.renaming === session.id) {
      // The list redraws when the session changes; the draft survives that.
      this.renameDraft ??= session.title;
      const input = h('input', {
        class: 'rename-input',
        value: this.renameDraft,
        'aria-label': 'Session title',
        maxlength: '300',
        oninput: (event) => (this.renameDraft = event.target.value),
      });
      const save = async () => {
        try {
          const updated = await api.updateSession(session.id, { title: input.value.trim() });
          this.renaming = null;
          this.renameDraft = null;
          this.updateSession(updated);
          if (current) document.dispatchEvent(new CustomEvent('hermesweb:session-renamed', { detail: updated }));
        } catch (error) {
          input.setCustomValidity(error.message);
          input.reportValidity();
        }
      };
      input.addEventListener('keydown', (event) => {
        if (event.key === 'Enter') {
          event.preventDefault();
          save();
        } else if (event.key === 'Escape') {
          this.renaming = null;
          this.renameDraft = null;
          this.render();
        }
      });
      queueMicrotask(() => {
        input.focus();
        input.setSelectionRange(input.value.length, input.value.length);
      });
      return h('li', { class: 'session renaming', dataset: { sessionId: String(session.id) } }, input, h('button', { type: 'button', class: 'btn small primary', text: 'Save', onclick: save }));
    }
    return h(
      'li',
      { class: `session${current ? ' current' : ''}`, dataset: { sessionId: String(session.id) } },
      h(
        'a',
        { href: `/sessions/${session.id}/`, 'aria-current': current ? 'page' : null },
        session.active_run_id ? h('span', { class: 'running-dot', title: 'A run is active', 'aria-label': 'running' }) : null,
        h('span', { class: 'session-title', text: sessionTitle(session) }),
      ),
      h(
        'span',
        { class: 'session-actions' },
        h('button', { type: 'button', class: 'icon', title: 'Rename', 'aria-label': `Rename ${sessionTitle(session)}`, dataset: { action: 'rename' }, text: '✎', onclick: () => ((this.renaming = session.id), (this.renameDraft = null), this.render()) }),
        h('button', { type: 'button', class: 'icon', title: 'Delete', 'aria-label': `Delete ${sessionTitle(session)}`, dataset: { action: 'delete' }, text: '✕', onclick: () => this.deleteSession(session) }),
      ),
    );
  }

  async newSession(project) {
    try {
      const session = await api.createSession(project.id);
      location.assign(`/sessions/${session.id}/`);
    } catch (error) {
      alertDialog(`Could not create a session: ${error.message}`);
    }
  }

  async deleteSession(session) {
    const ok = await confirmDialog(`Delete “${sessionTitle(session)}” and its whole transcript?`, 'Delete');
    if (!ok) return;
    try {
      await api.deleteSession(session.id);
    } catch (error) {
      alertDialog(error instanceof ApiError && error.status === 409 ? 'A run is still active in this session; stop it first.' : `Could not delete: ${error.message}`);
      return;
    }
    const list = this.sessions.get(session.project_id) || [];
    this.sessions.set(session.project_id, list.filter((s) => s.id !== session.id));
    if (session.id === this.currentSessionId) this.onDeletedCurrent(session);
    else this.render();
  }

  launchDialog(workflow) {
    const fields = (workflow.variables || []).map((name) =>
      h('label', { class: 'field' }, h('span', { text: name }), h('textarea', { name, rows: 2, required: true })),
    );
    const error = h('div', { class: 'form-error', role: 'alert' });
    const clientId = uuid();
    const dialog = formDialog(`Launch “${workflow.name}”`, [workflow.description ? h('p', { class: 'muted', text: workflow.description }) : null, ...fields, error], 'Launch', async (form) => {
      const variables = {};
      for (const name of workflow.variables || []) variables[name] = form.elements.namedItem(name).value;
      try {
        const result = await api.launchWorkflow(workflow.id, { variables, client_id: clientId });
        const run = await api.run(result.run_id);
        location.assign(`/sessions/${run.session_id}/`);
        return true;
      } catch (err) {
        error.textContent = err.message;
        return false;
      }
    });
    dialog.showModal();
  }

  newProjectDialog() {
    const error = h('div', { class: 'form-error', role: 'alert' });
    const dialog = formDialog(
      'New project',
      [
        h('label', { class: 'field' }, h('span', { text: 'Name' }), h('input', { name: 'name', required: true, maxlength: '200' })),
        h('label', { class: 'field' }, h('span', { text: 'Directory (absolute path inside an allowed root)' }), h('input', { name: 'path', required: true })),
        h(
          'label',
          { class: 'field' },
          h('span', { text: 'While the agent is running, new messages' }),
          h('select', { name: 'running_default' }, h('option', { value: 'queue', text: 'Queue by default' }), h('option', { value: 'steer', text: 'Steer by default' })),
        ),
        error,
      ],
      'Create',
      async (form) => {
        const body = {
          name: form.elements.namedItem('name').value,
          path: form.elements.namedItem('path').value,
          running_default: form.elements.namedItem('running_default').value,
        };
        try {
          const project = await api.createProject(body);
          location.assign(`/projects/${project.id}/`);
          return true;
        } catch (err) {
          error.textContent = err.message;
          return false;
        }
      },
    );
    dialog.showModal();
  }
}

// ---------------------------------------------------------------- dialogs

function formDialog(title, body, submitLabel, onSubmit) {
  const dialog = h('dialog', { class: 'dialog' });
  const form = h(
    'form',
    { method: 'dialog' },
    h('h2', { text: title }),
    body,
    h('div', { class: 'dialog-actions' }, h('button', { type: 'button', class: 'btn', value: 'cancel', text: 'Cancel', onclick: () => dialog.close() }), h('button', { type: 'submit', class: 'btn primary', text: submitLabel })),
  );
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const button = form.querySelector('button[type=submit]');
    button.disabled = true;
    const done = await onSubmit(form);
    button.disabled = false;
    if (done) dialog.close();
  });
  dialog.append(form);
  dialog.addEventListener('close', () => dialog.remove());
  document.body.append(dialog);
  return dialog;
}

export function confirmDialog(message, confirmLabel = 'OK') {
  return new Promise((resolve) => {
    let answer = false;
    const dialog = formDialog('Are you sure?', [h('p', { text: message })], confirmLabel, async () => {
      answer = true;
      return true;
    });
    dialog.querySelector('button[type=submit]').classList.add('danger');
    dialog.addEventListener('close', () => resolve(answer));
    dialog.showModal();
  });
}

export function alertDialog(message) {
  const dialog = formDialog('Something went wrong', [h('p', { text: message })], 'OK', async () => true);
  dialog.querySelector('button[value=cancel]').remove();
  dialog.showModal();
}
