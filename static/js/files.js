// The Files panel (docs/workspace.md, "Files"): the project's tree beside the conversation
// (lazy, directories first), a viewer (highlighted code, markdown preview through the project's
// sanitizing path, images), and a plain editor whose Save sends If-Match: a file changed on disk
// meanwhile (412 `stale_file`) is shown with Reload / Overwrite, never overwritten silently.
// On a phone the panel takes the screen, with a back button. A diff's path in a tool card opens
// the file here. The git panel (gitpanel.js) sits at its top when the project is a repository.

import { ApiError, csrfToken, toLogin } from './api.js';
import { h, clear } from './dom.js';
import { decorateCode, highlight, renderMarkdown } from './markdown.js';
import { GitPanel } from './gitpanel.js';
import { MentionPicker } from './mentions.js';

const LANGUAGES = {
  py: 'python', js: 'javascript', mjs: 'javascript', ts: 'typescript', tsx: 'typescript', jsx: 'javascript',
  json: 'json', css: 'css', html: 'xml', xml: 'xml', svg: 'xml', sh: 'bash', bash: 'bash', toml: 'ini',
  ini: 'ini', cfg: 'ini', yml: 'yaml', yaml: 'yaml', md: 'markdown', rs: 'rust', go: 'go', java: 'java',
  c: 'c', h: 'c', cpp: 'cpp', sql: 'sql', rb: 'ruby', diff: 'diff', patch: 'diff', txt: 'plaintext',
};
const IMAGES = /\.(png|jpe?g|gif|webp|avif)$/i;

export function languageFor(path) {
  const ext = path.includes('.') ? path.split('.').pop().toLowerCase() : '';
  return LANGUAGES[ext] || '';
}

// A request for the files API that answers the raw response (bodies here are a file's bytes).
async function raw(method, url, body = undefined, headers = {}) {
  const response = await fetch(url, {
    method,
    credentials: 'same-origin',
    headers: { 'X-CSRFToken': csrfToken(), ...headers },
    body,
  });
  if (response.status === 401) toLogin();
  return response;
}

async function json(method, url, body = undefined) {
  const response = await raw(method, url, body === undefined ? undefined : JSON.stringify(body), body === undefined ? {} : { 'Content-Type': 'application/json' });
  let data = null;
  try { data = await response.json(); } catch { data = null; }
  if (!response.ok) throw new ApiError(response.status, data?.code || `http_${response.status}`, data?.message || response.statusText, data?.details);
  return data;
}

// `sessionId`: the session's tree — its own worktree when it has one (docs/worktrees.md) —
// rather than the project's main checkout.
const scoped = (sessionId) => (sessionId ? `&session=${encodeURIComponent(sessionId)}` : '');

export const filesApi = {
  list: (projectId, path, sessionId) => json('GET', `/api/projects/${projectId}/files?path=${encodeURIComponent(path)}${scoped(sessionId)}`),
  search: (projectId, q, sessionId) => json('GET', `/api/projects/${projectId}/files/search?q=${encodeURIComponent(q)}${scoped(sessionId)}`),
  git: (projectId, sessionId) => json('GET', `/api/projects/${projectId}/git?${scoped(sessionId).slice(1)}`),
  commit: (projectId, body, sessionId) => json('POST', `/api/projects/${projectId}/git/commit?${scoped(sessionId).slice(1)}`, body),
  contentUrl: (projectId, path, sessionId) => `/api/projects/${projectId}/files/content?path=${encodeURIComponent(path)}${scoped(sessionId)}`,
};

export class FilesPanel {
  constructor(workbench, project, session = null) {
    this.workbench = workbench;
    this.project = project;
    this.sessionId = session?.id || null;
    this.current = null; // {path, etag, text}
    this.element = h('aside', { class: 'files-panel', id: 'files-panel', 'aria-label': 'Files', hidden: true });
    this.back = h('button', { type: 'button', class: 'btn small files-back', 'data-role': 'files-back', text: '← Back' });
    this.close = h('button', { type: 'button', class: 'icon files-close', 'data-role': 'files-close', 'aria-label': 'Close files', text: '✕' });
    this.git = new GitPanel(project, () => this.refresh(), this.sessionId);
    this.tree = h('ul', { class: 'files-tree', role: 'tree', 'aria-label': 'Project files', 'data-role': 'files-tree' });
    this.viewer = h('section', { class: 'files-viewer', 'data-role': 'files-viewer', 'aria-label': 'File', hidden: true });
    this.element.append(
      h('header', { class: 'files-head' }, this.back, h('h2', { text: 'Files' }), h('span', { class: 'files-root muted', 'data-role': 'files-root', title: project.path, text: session?.worktree ? `${project.name} · ${session.worktree.branch}` : project.name }), this.close),
      this.git.element,
      h('div', { class: 'files-body' }, this.tree, this.viewer),
    );
    this.back.addEventListener('click', () => (this.viewer.hidden ? this.toggle(false) : this.showTree()));
    this.close.addEventListener('click', () => this.toggle(false));
    workbench.append(this.element);
  }

  toggle(open = this.element.hidden) {
    this.element.hidden = !open;
    this.workbench.classList.toggle('files-open', open);
    document.querySelector('[data-role="files-toggle"]')?.setAttribute('aria-pressed', String(open));
    if (open && !this.loaded) {
      this.loaded = true;
      this.refresh();
    }
  }

  refresh() {
    this.loadDir('', this.tree);
    this.git.load();
  }

  showTree() {
    this.viewer.hidden = true;
    this.element.classList.remove('viewing');
  }

  async loadDir(path, list) {
    try {
      const answer = await filesApi.list(this.project.id, path, this.sessionId);
      clear(list);
      // The repository's own store is the git panel's business, not a tree to browse.
      for (const entry of answer.entries) if (entry.path !== '.git') list.append(this.entryItem(entry));
      if (answer.truncated) list.append(h('li', { class: 'muted files-note', text: 'Only the first 1,000 entries are listed.' }));
    } catch (error) {
      clear(list);
      list.append(h('li', { class: 'files-note error', text: `Could not list ${path || 'the project'}: ${error.message}` }));
    }
  }

  entryItem(entry) {
    const label = h('button', { type: 'button', class: `files-entry ${entry.type}`, 'data-path': entry.path, 'data-type': entry.type, title: entry.path },
      h('span', { class: 'files-icon', 'aria-hidden': 'true', text: entry.type === 'dir' ? '▸' : entry.type === 'symlink' ? '↪' : '·' }),
      h('span', { class: 'files-name', text: entry.name }));
    const item = h('li', { role: 'treeitem' }, label);
    if (entry.type === 'dir') {
      item.setAttribute('aria-expanded', 'false');
      const children = h('ul', { role: 'group', hidden: true });
      item.append(children);
      label.addEventListener('click', () => {
        const open = children.hidden;
        children.hidden = !open;
        item.setAttribute('aria-expanded', String(open));
        label.firstChild.textContent = open ? '▾' : '▸';
        if (open && !children.dataset.loaded) {
          children.dataset.loaded = 'true';
          children.append(h('li', { class: 'muted files-note', text: 'Loading…' }));
          this.loadDir(entry.path, children);
        }
      });
    } else if (entry.type === 'file') {
      label.addEventListener('click', () => this.open(entry.path));
    } else {
      label.disabled = true; // a symlink is listed, never followed
    }
    return item;
  }

  // Open `path` (relative to the project) in the viewer.
  async open(path) {
    if (this.element.hidden) this.toggle(true);
    this.viewer.hidden = false;
    this.element.classList.add('viewing');
    clear(this.viewer);
    const url = filesApi.contentUrl(this.project.id, path, this.sessionId);
    this.viewer.append(this.viewerHead(path, null));
    if (IMAGES.test(path)) {
      this.viewer.append(h('div', { class: 'files-image' }, h('img', { src: url, alt: path })));
      return;
    }
    const response = await raw('GET', url);
    if (!response.ok) {
      this.viewer.append(h('p', { class: 'files-note error', text: response.status === 404 ? 'No such file in the project.' : `Could not open it (${response.status}).` }));
      return;
    }
    if (!(response.headers.get('Content-Type') || '').startsWith('text/plain')) {
      this.viewer.append(h('p', { class: 'files-note' }, 'Not a text file: ', h('a', { href: url, download: path.split('/').pop(), text: 'download it' }), '.'));
      return;
    }
    const text = await response.text();
    this.current = { path, etag: response.headers.get('ETag'), text };
    this.showText(path, text);
  }

  viewerHead(path, actions) {
    return h('div', { class: 'files-viewer-head' },
      h('code', { class: 'files-path', 'data-role': 'files-path', title: path, text: path }),
      actions || h('span'));
  }

  showText(path, text, preview = languageFor(path) === 'markdown') {
    clear(this.viewer);
    const edit = h('button', { type: 'button', class: 'btn small', 'data-role': 'files-edit', text: 'Edit' });
    const buttons = h('span', { class: 'files-actions' });
    if (languageFor(path) === 'markdown') {
      const flip = h('button', { type: 'button', class: 'btn small', 'data-role': 'files-preview', text: preview ? 'Source' : 'Preview' });
      flip.addEventListener('click', () => this.showText(path, text, !preview));
      buttons.append(flip);
    }
    buttons.append(edit);
    edit.addEventListener('click', () => this.edit(path, text));
    this.viewer.append(this.viewerHead(path, buttons));
    if (preview) {
      const body = h('div', { class: 'files-markdown md' });
      body.append(renderMarkdown(text));
      decorateCode(body);
      this.viewer.append(body);
      return;
    }
    const code = h('code', { class: `language-${languageFor(path) || 'plaintext'}`, text });
    highlight(code);
    this.viewer.append(h('pre', { class: 'files-code' }, code));
  }

  edit(path, text) {
    clear(this.viewer);
    const area = h('textarea', { class: 'files-editor', 'data-role': 'files-editor', spellcheck: 'false', 'aria-label': `Edit ${path}` });
    area.value = text;
    const save = h('button', { type: 'button', class: 'btn primary small', 'data-role': 'files-save', text: 'Save' });
    const cancel = h('button', { type: 'button', class: 'btn small', text: 'Cancel' });
    const note = h('div', { class: 'files-conflict', 'data-role': 'files-conflict', role: 'alert', hidden: true });
    const status = h('span', { class: 'muted files-status', 'data-role': 'files-status', role: 'status' });
    this.viewer.append(this.viewerHead(path, h('span', { class: 'files-actions' }, status, cancel, save)), note, area);
    cancel.addEventListener('click', () => this.showText(path, this.current.text));
    save.addEventListener('click', () => this.save(path, area.value, this.current.etag, { save, note, status }));
    area.focus();
  }

  async save(path, text, etag, ui) {
    ui.save.disabled = true;
    ui.status.textContent = 'Saving…';
    // No ETag: the file is gone from disk, and Overwrite makes it again (If-None-Match: *).
    const precondition = etag ? { 'If-Match': etag } : { 'If-None-Match': '*' };
    const response = await raw('PUT', filesApi.contentUrl(this.project.id, path, this.sessionId), text, { ...precondition, 'Content-Type': 'application/octet-stream' });
    ui.save.disabled = false;
    if (response.ok) {
      const answer = await response.json();
      this.current = { path, etag: answer.etag, text };
      ui.status.textContent = 'Saved';
      this.git.load();
      this.showText(path, text, false);
      this.viewer.querySelector('.files-actions')?.prepend(h('span', { class: 'muted files-status', 'data-role': 'files-status', role: 'status', text: 'Saved' }));
      return;
    }
    let body = null;
    try { body = await response.json(); } catch { body = null; }
    ui.status.textContent = '';
    if (response.status === 412 && body?.code === 'stale_file') {
      // Never a silent overwrite: the user chooses, seeing that the file moved on without them.
      clear(ui.note);
      ui.note.hidden = false;
      const reload = h('button', { type: 'button', class: 'btn small', 'data-role': 'files-reload', text: 'Reload' });
      const overwrite = h('button', { type: 'button', class: 'btn danger small', 'data-role': 'files-overwrite', text: 'Overwrite' });
      ui.note.append(
        h('p', { text: `${path} changed on disk since you opened it. Reload it (your edits are dropped) or overwrite it with yours.` }),
        h('span', { class: 'files-actions' }, reload, overwrite));
      reload.addEventListener('click', () => this.open(path));
      overwrite.addEventListener('click', () => {
        ui.note.hidden = true;
        this.save(path, text, body.details?.etag || null, ui);
      });
      return;
    }
    ui.status.textContent = `Not saved: ${body?.message || response.statusText}`;
  }
}

// A tool card's diff names an absolute path: inside the project, it opens here.
function relativeTo(root, path) {
  if (!path) return null;
  const base = root.endsWith('/') ? root : `${root}/`;
  if (path.startsWith(base)) return path.slice(base.length);
  return path.startsWith('/') ? null : path;
}

// A worktree session works in its own tree (docs/worktrees.md): the empty state names it, its
// path once the files API answers (none before the runner made it) and its branch.
async function nameTheTree(data, found) {
  const worktree = data.session?.worktree;
  const empty = document.querySelector('[data-role=empty]');
  if (!worktree || !empty) return;
  const say = (path) => {
    const where = path ? [' works in ', h('code', { text: path })] : [' works in its own worktree'];
    clear(empty).append(h('p', { 'data-role': 'empty-tree' },
      'Say what you want done. The agent', ...where, ' on branch ', h('code', { text: worktree.branch }),
      path ? ', its own worktree.' : ` (made before the first turn, from ${worktree.base}).`));
  };
  say(null);
  try {
    const answer = await filesApi.list(data.project.id, '', data.session.id);
    found(answer.root);
    say(answer.root);
  } catch {
    // not made yet, or discarded: the branch is all there is to name
  }
}

function install() {
  const data = JSON.parse(document.getElementById('workbench-data')?.textContent || 'null');
  const workbench = document.getElementById('workbench');
  const tools = document.querySelector('.topbar-tools');
  if (!data?.project || !workbench || !tools) return;
  const panel = new FilesPanel(workbench, data.project, data.session);
  const toggle = h('button', { type: 'button', class: 'btn small files-toggle', 'data-role': 'files-toggle', 'aria-pressed': 'false', 'aria-controls': 'files-panel', title: 'The project’s files', text: 'Files' });
  toggle.addEventListener('click', () => panel.toggle());
  tools.prepend(toggle);
  let root = data.project.path;
  nameTheTree(data, (path) => { root = path; });
  document.addEventListener('click', (event) => {
    const target = event.target.closest?.('.diff-path, [data-file-path]');
    if (!target) return;
    const path = relativeTo(root, target.dataset.filePath || target.title);
    if (path) panel.open(path);
  });
  const box = document.querySelector('[data-role=composer] textarea');
  if (box) new MentionPicker(box, (q) => filesApi.search(data.project.id, q, data.session?.id));
}

install();
