// Archiving from the browser (docs/ui.md, "Managing from the browser"): a session or a project
// is archived and restored with PATCH …{status}; the sidebar keeps archived ones in lists of
// their own, and the composer of an archived one says why it takes nothing and offers Restore.
// The server refuses messages either way (409 session_archived / project_archived).

import { api } from './api.js';
import { h } from './dom.js';

export const isArchived = (thing) => thing?.status === 'archived';

// The changed object goes to every part of the page that shows it (sidebar, session, composer).
function announce(kind, detail) {
  document.dispatchEvent(new CustomEvent(`hermesweb:${kind}-updated`, { detail }));
}

export async function setSessionStatus(session, status) {
  const updated = await api.updateSession(session.id, { status });
  announce('session', updated);
  return updated;
}

export async function setProjectStatus(project, status) {
  const updated = await api.updateProject(project.id, { status });
  announce('project', updated);
  return updated;
}

// Why the composer takes nothing, and the way back: the project's archive first (restoring
// the session alone would not let a message through), then the session's. Null: it takes messages.
export function composerLock({ project, session }) {
  if (isArchived(project)) {
    return {
      kind: 'project',
      text: `The project “${project.name}” is archived: its sessions can be read but take no new messages.`,
      action: 'Restore project',
      run: () => setProjectStatus(project, 'active'),
    };
  }
  if (isArchived(session)) {
    return {
      kind: 'session',
      text: 'This session is archived: it can be read but takes no new messages.',
      action: 'Restore session',
      run: () => setSessionStatus(session, 'active'),
    };
  }
  return null;
}

// A collapsed list of a project's archived sessions, each with Restore (sidebar).
export function archivedSessions({ project, sessions, open, onToggle, renderSession }) {
  if (!sessions.length) return null;
  const id = `archived-sessions-${project.id}`;
  return h(
    'div',
    { class: 'archived-sessions' },
    h(
      'button',
      {
        type: 'button',
        class: 'section-toggle',
        'aria-expanded': String(open),
        'aria-controls': id,
        onclick: onToggle,
      },
      h('span', { class: 'chevron', 'aria-hidden': 'true', text: open ? '▾' : '▸' }),
      `Archived (${sessions.length})`,
    ),
    h('ul', { class: 'session-list archived', id, hidden: !open, 'aria-label': `Archived sessions of ${project.name}` }, sessions.map(renderSession)),
  );
}

// The "Archived projects" section at the bottom of the project list (collapsed unless the
// page is on one of them): `items`, the archived projects' rendered entries.
export function archivedProjects({ items, open, onToggle }) {
  if (!items.length) return null;
  return h(
    'li',
    { class: 'archived-projects' },
    h(
      'button',
      { type: 'button', class: 'section-toggle', 'aria-expanded': String(open), 'aria-controls': 'archived-projects', onclick: onToggle },
      h('span', { class: 'chevron', 'aria-hidden': 'true', text: open ? '▾' : '▸' }),
      `Archived projects (${items.length})`,
    ),
    h('ul', { class: 'project-list', id: 'archived-projects', hidden: !open, 'aria-label': 'Archived projects' }, items),
  );
}
