// Projects and their sessions: search, rename, archive and restore, delete, new session,
// import the agent's sessions, archive and restore a project; workflows: delete, and the forms
// (new project, project settings, new and edited workflow, launch: manage.js) opened from here.
// Every session's live state as badges. All through the API (projects/api.py).

import { api, ApiError } from './api.js';
import { archivedProjects, archivedSessions, isArchived, setProjectStatus, setSessionStatus } from './archive.js';
import { alertDialog, confirmDialog } from './dialogs.js';
import { h, heldWhilePressed } from './dom.js';
import { importDialog } from './import.js';
import { automationsDialog } from './automations.js';
import { editProjectDialog, launchDialog, newProjectDialog, workflowDialog } from './manage.js';
import { waitingBadge, waitingText } from './waiting.js';
import { newWorktreeSessionDialog, worktreeBadge } from './worktree.js';

export function sessionTitle(session) {
  return session.title || `Untitled session ${session.id}`;
}

const AWAITING = new Set(['awaiting_approval', 'awaiting_clarify']);
const FAILED = new Set(['failed', 'interrupted']);

// How many sessions wait on the user (an approval or a question): the tab's title and favicon.
export function waitingCount(states) {
  return [...states.values()].filter((s) => AWAITING.has(s.run_status)).length;
}

// A session's live state as badges: running (a spinner), needs you, queued messages, failed.
function liveBadges(session, state) {
  const status = state ? state.run_status : session.active_run_id ? 'running' : null;
  const badges = [];
  if (AWAITING.has(status)) {
    const label = status === 'awaiting_approval' ? 'Needs you: approval' : 'Needs you: a question';
    badges.push(h('span', { class: 'live-state needs-you', role: 'img', 'aria-label': label, title: label, text: 'needs you' }));
  } else if (status === 'queued' && state?.waiting) {
    const label = waitingText(state.waiting);
    badges.push(h('span', { class: 'live-state waiting', role: 'img', 'aria-label': label, title: label, text: waitingBadge(state.waiting) }));
} else if (status) {
    badges.push(h('span', { class: 'live-state running', role: 'img', 'aria-label': 'Running', title: status === 'queued' ? 'Starting' : 'Running' }));
  }
  if (state?.queued) {
    const label = `${state.queued} queued message${state.queued === 1 ? '' : 's'}`;
    badges.push(h('span', { class: 'live-state queued', role: 'img', 'aria-label': label, title: label, text: `+${state.queued}` }));
  }
  if (!status && state && FAILED.has(state.last_run_status)) {
    const label = state.last_run_status === 'failed' ? 'Last run failed' : 'Last run was interrupted';
    badges.push(h('span', { class: 'live-state failed', role: 'img', 'aria-label': label, title: label, text: 'failed' }));
  }
  return badges;
}

// What names a control across renders: its place (session, project) and its part, not its label
// (a session's title is in its buttons' labels, and may have changed).
function focusKey(el) {
  const part = el.dataset.role || el.dataset.action || el.className || '';
  const session = el.closest('[data-session-id]')?.dataset.sessionId ?? '';
  const project = el.closest('[data-project-id]')?.dataset.projectId ?? '';
  const archived = el.closest('.archived-projects, .archived-sessions')?.className ?? '';
  return [el.tagName, part, session, project, archived].join('|');
}

export class Sidebar {
  constructor(root, data, { currentSessionId, onDeletedCurrent }) {
    this.root = root;
    this.projects = data.projects || [];
    this.currentProjectId = data.project?.id ?? null;
    this.currentSessionId = currentSessionId;
    this.onDeletedCurrent = onDeletedCurrent;
    this.sessions = new Map();
    // Every session's live state, from the user channel (`sessions` frames; runs/live/user_feed.py).
    this.states = new Map();
    this.statesReady = false;
    this.workflows = new Map();
    this.expanded = new Set();
    this.renaming = null;
    this.renameDraft = null;
    this.query = '';
    // Archived lists are collapsed, unless the page is on something in them.
    this.archivedOpen = new Set(isArchived(data.session) ? [this.currentProjectId] : []);
    this.archivedProjectsOpen = isArchived(data.project);
    if (this.currentProjectId !== null) {
      this.sessions.set(this.currentProjectId, data.sessions || []);
      this.workflows.set(this.currentProjectId, data.workflows || []);
      this.expanded.add(this.currentProjectId);
    }
    // Archived or restored here, from the composer, or by another tab (the session socket).
    document.addEventListener('hermesweb:session-updated', (event) => this.updateSession(event.detail));
    document.addEventListener('hermesweb:project-updated', (event) => this.replaceProject(event.detail));
    this.list = root.querySelector('[data-role=project-list]');
    this.search = root.querySelector('[data-role=search]');
    this.search.addEventListener('input', () => {
      this.query = this.search.value.trim().toLowerCase();
      if (this.query) this.loadAll();
      this.render();
    });
    root.querySelector('[data-role=new-project]').addEventListener('click', () => newProjectDialog());
    // Every redraw waits while the user is pressing something in the list (dom.js says why).
    this.render = heldWhilePressed(this.list, () => this.draw());
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

  // The open session changed (title, active run, status) — keep its entry in step.
  updateSession(session) {
    const list = this.sessions.get(session.project_id);
    if (!list) return;
    const index = list.findIndex((s) => s.id === session.id);
    const was = index === -1 ? null : list[index];
    if (index === -1) list.unshift(session);
    else list[index] = { ...list[index], ...session };
    // The page's own session archived: its entry stays in view, in the opened Archived list.
    if (session.id === this.currentSessionId && isArchived(session) && !isArchived(was)) this.archivedOpen.add(session.project_id);
    this.render();
  }

  // A `sessions` frame: a snapshot (the sessions it leaves out are idle) or the changed ones.
  // Returns what the notifier needs: the states before, the frame's, and whether it is the first.
  applyStates(frame) {
    const prev = new Map(this.states);
    const first = !this.statesReady;
    if (frame.snapshot) this.states = new Map();
    for (const state of frame.sessions) this.states.set(state.id, state);
    for (const id of frame.removed || []) this.states.delete(id);
    this.statesReady = true;
    for (const state of frame.sessions) this.followState(state);
    for (const id of frame.removed || []) {
      if (id === this.currentSessionId) continue;
      for (const [projectId, list] of this.sessions) this.sessions.set(projectId, list.filter((s) => s.id !== id));
    }
    this.render();
    return { prev, changed: frame.sessions, first };
  }

  // A listed project's sessions keep in step with the channel: titles, and sessions made elsewhere.
  followState(state) {
    const list = this.sessions.get(state.project_id);
    if (!list) return;
    const session = list.find((s) => s.id === state.id);
    const status = state.archived ? 'archived' : 'active';
    if (!session) list.unshift({ id: state.id, project_id: state.project_id, title: state.title, status, active_run_id: state.run_id });
    else Object.assign(session, { title: state.title, status, active_run_id: state.run_id });
  }

  replaceProject(project) {
    if (!this.projects.some((p) => p.id === project.id)) return;
    this.projects = this.projects.map((p) => (p.id === project.id ? { ...p, ...project } : p));
    if (project.id === this.currentProjectId && isArchived(project)) this.archivedProjectsOpen = true;
    this.render();
  }

  draw() {
    const focused = this.list.contains(document.activeElement) ? focusKey(document.activeElement) : null;
    const q = this.query;
    const items = [];
    const shelved = [];
    for (const project of this.projects) {
      const sessions = this.sessions.get(project.id) || [];
      const matching = q ? sessions.filter((s) => sessionTitle(s).toLowerCase().includes(q)) : sessions;
      const projectMatches = q && project.name.toLowerCase().includes(q);
      if (q && !projectMatches && !matching.length) continue;
      const open = this.expanded.has(project.id) || !!q;
      (isArchived(project) ? shelved : items).push(this.renderProject(project, projectMatches ? sessions : matching, open));
    }
    if (!this.projects.length) {
      items.push(h('li', { class: 'empty' }, 'No projects yet. Create one to start.'));
    } else if (q && !items.length && !shelved.length) {
      items.push(h('li', { class: 'empty', text: 'No session titles match.' }));
    } else if (!q && !items.length) {
      items.push(h('li', { class: 'empty', text: 'No active projects.' }));
    }
    const toggle = () => {
      this.archivedProjectsOpen = !this.archivedProjectsOpen;
      this.render();
      this.list.querySelector('.archived-projects > .section-toggle')?.focus();
    };
    items.push(archivedProjects({ items: shelved, open: this.archivedProjectsOpen || !!q, onToggle: toggle }));
    this.list.replaceChildren(...items.filter(Boolean));
    // The control that had the focus is redrawn too: the focus moves to its new copy.
    if (focused) [...this.list.querySelectorAll('a, button, input')].find((el) => focusKey(el) === focused)?.focus({ preventScroll: true });
  }

  renderProject(project, sessions, open) {
    const current = project.id === this.currentProjectId;
    const archived = isArchived(project);
    const workflows = this.workflows.get(project.id) || [];
    const live = sessions.filter((s) => !isArchived(s));
    const shelved = sessions.filter(isArchived);
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
      { class: `project${current ? ' current' : ''}${archived ? ' archived' : ''}`, dataset: { projectId: String(project.id) } },
      h(
        'div',
        { class: 'project-row' },
        h('button', { type: 'button', class: 'disclosure', 'aria-expanded': String(open), 'aria-label': `Show sessions of ${project.name}`, text: open ? '▾' : '▸', onclick: toggle }),
        h('a', { class: 'project-name', href: `/projects/${project.id}/`, text: project.name }),
        open ? null : this.projectBadges(project),
        h('button', { type: 'button', class: 'icon', 'data-role': 'edit-project', title: 'Project settings', 'aria-label': `Edit project ${project.name}`, text: '⚙', onclick: () => this.editProject(project) }),
        archived
          ? h('button', { type: 'button', class: 'btn small', 'data-role': 'restore-project', 'aria-label': `Restore project ${project.name}`, text: 'Restore', onclick: () => this.setProjectArchived(project, false) })
          : [
              h('button', { type: 'button', class: 'icon', 'data-role': 'new-worktree-session', title: 'New session in its own worktree', 'aria-label': `New session in its own worktree in ${project.name}`, text: '⎇', onclick: () => newWorktreeSessionDialog(project) }),
              h('button', { type: 'button', class: 'btn small', 'data-role': 'new-session', title: 'New session', text: '+ New', onclick: () => this.newSession(project) }),
            ],
      ),
      open
        ? h(
            'ul',
            { class: 'session-list' },
            live.length ? live.map((s) => this.renderSession(s)) : h('li', { class: 'empty', text: shelved.length ? 'No active sessions.' : 'No sessions yet.' }),
          )
        : null,
      open ? this.renderSessionExtras(project, shelved) : null,
      open && current
        ? h(
            'div',
            { class: 'workflows' },
            h(
              'div',
              { class: 'section-head' },
              h('div', { class: 'section-label', id: `workflows-${project.id}`, text: 'Workflows' }),
              h('button', { type: 'button', class: 'btn link small', 'data-role': 'new-workflow', text: 'New workflow', onclick: () => this.editWorkflow(project, null) }),
            ),
            h(
              'ul',
              { 'aria-labelledby': `workflows-${project.id}` },
              workflows.map((w) =>
                h(
                  'li',
                  { class: 'workflow', dataset: { workflowId: String(w.id) } },
                  h('span', { class: 'workflow-name', text: w.name, title: w.description || w.prompt_template }),
                  h('button', { type: 'button', class: 'icon', 'data-role': 'edit-workflow', title: 'Edit', 'aria-label': `Edit workflow ${w.name}`, text: '✎', onclick: () => this.editWorkflow(project, w) }),
                  h('button', { type: 'button', class: 'icon', 'data-role': 'delete-workflow', title: 'Delete', 'aria-label': `Delete workflow ${w.name}`, text: '✕', onclick: () => this.deleteWorkflow(project, w) }),
                  h('button', { type: 'button', class: 'icon', 'data-role': 'automations', title: 'Automations', 'aria-label': `Automations of workflow ${w.name}`, text: '◷', onclick: () => automationsDialog(w) }),
                  archived ? null : h('button', { type: 'button', class: 'btn small', 'data-role': 'launch', text: 'Launch', onclick: () => launchDialog(w) }),
                ),
              ),
            ),
          )
        : null,
    );
  }

  // Under a project's sessions: its Archived list (collapsed) and Import.
  renderSessionExtras(project, shelved) {
    const open = this.archivedOpen.has(project.id) || (!!this.query && shelved.length > 0);
    const toggle = () => {
      if (this.archivedOpen.has(project.id)) this.archivedOpen.delete(project.id);
      else this.archivedOpen.add(project.id);
      this.render();
      this.list.querySelector(`[data-project-id="${project.id}"] .archived-sessions .section-toggle`)?.focus();
    };
    const list = archivedSessions({ project, sessions: shelved, open, onToggle: toggle, renderSession: (s) => this.renderSession(s) });
    const importButton = isArchived(project)
      ? null
      : h('button', { type: 'button', class: 'btn link small', 'data-role': 'import-sessions', 'aria-label': `Import agent sessions into ${project.name}`, text: 'Import…', onclick: () => importDialog(project) });
    if (!list && !importButton) return null;
    return h('div', { class: 'session-extras' }, list, importButton);
  }

  async setSessionArchived(session, archived) {
    try {
      await setSessionStatus(session, archived ? 'archived' : 'active');
    } catch (error) {
      alertDialog(`Could not ${archived ? 'archive' : 'restore'} the session: ${error.message}`);
      return;
    }
    // Focus stays near what moved: the Archived list's toggle, or the restored session.
    const row = this.list.querySelector(`[data-project-id="${session.project_id}"]`);
    const target = archived ? row?.querySelector('.archived-sessions .section-toggle') : row?.querySelector(`.session[data-session-id="${session.id}"] a`);
    target?.focus();
  }

  async setProjectArchived(project, archived) {
    try {
      await setProjectStatus(project, archived ? 'archived' : 'active');
    } catch (error) {
      alertDialog(`Could not ${archived ? 'archive' : 'restore'} the project: ${error.message}`);
      return;
    }
    const target = archived
      ? this.list.querySelector('.archived-projects > .section-toggle')
      : this.list.querySelector(`.project[data-project-id="${project.id}"] .project-name`);
    target?.focus();
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
        h('span', { class: 'session-title', text: sessionTitle(session) }),
        worktreeBadge(session),
        liveBadges(session, this.states.get(session.id)),
      ),
      isArchived(session)
        ? h(
            'span',
            { class: 'session-actions archived' },
            h('button', { type: 'button', class: 'btn link small', 'aria-label': `Restore ${sessionTitle(session)}`, dataset: { action: 'restore' }, text: 'Restore', onclick: () => this.setSessionArchived(session, false) }),
            h('button', { type: 'button', class: 'icon', title: 'Delete', 'aria-label': `Delete ${sessionTitle(session)}`, dataset: { action: 'delete' }, text: '✕', onclick: () => this.deleteSession(session) }),
          )
        : h(
            'span',
            { class: 'session-actions' },
            h('button', { type: 'button', class: 'icon', title: 'Rename', 'aria-label': `Rename ${sessionTitle(session)}`, dataset: { action: 'rename' }, text: '✎', onclick: () => ((this.renaming = session.id), (this.renameDraft = null), this.render()) }),
            h('button', { type: 'button', class: 'icon', title: 'Archive', 'aria-label': `Archive ${sessionTitle(session)}`, dataset: { action: 'archive' }, text: '⤓', onclick: () => this.setSessionArchived(session, true) }),
            h('button', { type: 'button', class: 'icon', title: 'Delete', 'aria-label': `Delete ${sessionTitle(session)}`, dataset: { action: 'delete' }, text: '✕', onclick: () => this.deleteSession(session) }),
          ),
    );
  }

  // A collapsed project: how many of its sessions need the user, and whether any runs.
  projectBadges(project) {
    const states = [...this.states.values()].filter((s) => s.project_id === project.id);
    const waiting = states.filter((s) => AWAITING.has(s.run_status)).length;
    const running = states.some((s) => s.run_status && !AWAITING.has(s.run_status) && !s.waiting);
    const badges = [];
    if (running) badges.push(h('span', { class: 'live-state running', role: 'img', 'aria-label': 'Running', title: 'A session is running' }));
    if (waiting) {
      const label = `${waiting} session${waiting === 1 ? '' : 's'} need${waiting === 1 ? 's' : ''} you`;
      badges.push(h('span', { class: 'live-state needs-you', role: 'img', 'aria-label': label, title: label, text: String(waiting) }));
    }
    return badges.length ? h('span', { class: 'project-live' }, badges) : null;
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

  // ---------------------------------------------------------------- managing (the forms: manage.js)

  editProject(project) {
    // Offered until GET /api/agents answers (manage.js agentField): the names the projects use.
    const agents = [...new Set([...this.projects.map((p) => p.agent), 'demo', 'hermes'])];
    editProjectDialog(project, {
      agents,
      onSaved: (updated) => {
        this.projects = this.projects.map((p) => (p.id === updated.id ? updated : p));
        this.render();
      },
      onToggleArchived: () => this.setProjectArchived(project, !isArchived(project)),
    });
  }

  // `workflow` null: a new one, added at the end of the list; an edited one keeps its place.
  editWorkflow(project, workflow) {
    workflowDialog(project, workflow, {
      onSaved: (saved) => {
        const list = (this.workflows.get(project.id) || []).filter((w) => w.id !== saved.id);
        const index = (this.workflows.get(project.id) || []).findIndex((w) => w.id === saved.id);
        if (index === -1) list.push(saved);
        else list.splice(index, 0, saved);
        this.workflows.set(project.id, list);
        this.render();
      },
    });
  }

  async deleteWorkflow(project, workflow) {
    const ok = await confirmDialog(`Delete the workflow “${workflow.name}”? Sessions it started stay.`, 'Delete');
    if (!ok) return;
    try {
      await api.deleteWorkflow(workflow.id);
    } catch (error) {
      alertDialog(`Could not delete: ${error.message}`);
      return;
    }
    this.workflows.set(project.id, (this.workflows.get(project.id) || []).filter((w) => w.id !== workflow.id));
    this.render();
  }
}
