// `@` in the composer (docs/workspace.md, "Mentions"): typing `@` and a few letters lists the
// project's files and folders (the server's fuzzy search, bounded), ↑/↓ to move, Enter or Tab
// to choose, Escape to close. A chosen path is written into the text as `@path` and remembered:
// when the message is sent, each remembered path still in its text goes with it as a mention
// (`{mention: path}` beside the attachments), which the runner sends to the agent as a resource.

import { h } from './dom.js';

const chosen = new Set();
const TOKEN = /(?:^|\s)@([^\s@]*)$/;
const MAX_SHOWN = 12;

// The mentions of `text`: the chosen paths it still names as `@path`, in the order it names them.
export function mentionsIn(text) {
  const found = [];
  for (const path of chosen) {
    const at = text.search(new RegExp(`(^|\\s)@${path.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}(?=$|[\\s,.;:!?)])`));
    if (at >= 0) found.push([at, path]);
  }
  return found.sort((a, b) => a[0] - b[0]).map(([, path]) => ({ mention: path }));
}

// A turn's mentions put back (Edit of a sent or refused message): they count again if kept.
export function rememberMentions(attachments) {
  for (const item of attachments || []) if (item?.mention) chosen.add(item.mention);
}

// A mention as a chip (the transcript's and the outgoing message's): opens the file in Files.
export function mentionChip(path) {
  return h('li', { class: 'attachment mention' },
    h('button', { type: 'button', class: 'mention-chip', 'data-file-path': path, title: `Open ${path} in Files`, text: `@${path}` }));
}

export class MentionPicker {
  constructor(textarea, search) {
    this.textarea = textarea;
    this.search = search; // (q) => Promise<{matches: [{path, type}]}>
    this.items = [];
    this.index = 0;
    this.asked = 0; // the newest query's number: an older answer arriving late is dropped
    this.list = h('ul', { class: 'mention-list', id: 'mention-list', role: 'listbox', 'aria-label': 'Project paths', hidden: true });
    textarea.closest('form')?.prepend(this.list);
    textarea.addEventListener('input', () => this.update());
    // Capture: while the list is open its keys are ours, before the composer's Enter sends.
    textarea.addEventListener('keydown', (event) => this.onKey(event), true);
    textarea.addEventListener('blur', () => setTimeout(() => this.close(), 150));
  }

  get open() {
    return !this.list.hidden;
  }

  token() {
    const before = this.textarea.value.slice(0, this.textarea.selectionStart);
    const match = TOKEN.exec(before);
    return match ? match[1] : null;
  }

  async update() {
    const query = this.token();
    if (query === null) return this.close();
    const asked = ++this.asked;
    let answer;
    try {
      answer = await this.search(query);
    } catch {
      return this.close();
    }
    if (asked !== this.asked) return; // typed on meanwhile
    this.items = answer.matches.slice(0, MAX_SHOWN);
    this.index = 0;
    this.render();
  }

  render() {
    if (!this.items.length) return this.close();
    this.list.hidden = false;
    this.list.replaceChildren(...this.items.map((item, index) => {
      const option = h('li', {
        role: 'option', id: `mention-${index}`, class: 'mention-option', 'data-path': item.path,
        'aria-selected': String(index === this.index),
      }, h('span', { class: 'mention-kind', 'aria-hidden': 'true', text: item.type === 'dir' ? '▸' : '·' }), h('span', { text: item.type === 'dir' ? `${item.path}/` : item.path }));
      option.addEventListener('mousedown', (event) => { event.preventDefault(); this.choose(item); });
      return option;
    }));
    this.textarea.setAttribute('aria-activedescendant', `mention-${this.index}`);
  }

  close() {
    this.list.hidden = true;
    this.items = [];
    this.textarea.removeAttribute('aria-activedescendant');
  }

  onKey(event) {
    if (!this.open) return;
    if (event.key === 'ArrowDown' || event.key === 'ArrowUp') {
      const step = event.key === 'ArrowDown' ? 1 : -1;
      this.index = (this.index + step + this.items.length) % this.items.length;
      this.render();
    } else if ((event.key === 'Enter' && !event.shiftKey) || event.key === 'Tab') {
      this.choose(this.items[this.index]);
    } else if (event.key === 'Escape') {
      this.close();
    } else {
      return;
    }
    event.preventDefault();
    event.stopImmediatePropagation();
  }

  choose(item) {
    const caret = this.textarea.selectionStart;
    const before = this.textarea.value.slice(0, caret);
    const after = this.textarea.value.slice(caret);
    const start = before.lastIndexOf('@');
    const inserted = `@${item.path} `;
    this.textarea.value = before.slice(0, start) + inserted + after.replace(/^\S*/, '');
    const end = start + inserted.length;
    this.textarea.setSelectionRange(end, end);
    chosen.add(item.path);
    this.close();
    this.textarea.dispatchEvent(new Event('input', { bubbles: true }));
  }
}
