// The composer: Enter sends, Shift+Enter breaks the line; while a run is active
// a Queue/Steer choice (defaulting to the project's running_default) and Stop;
// a slash-command palette from the agent's advertised commands; attachments (a button,
// paste, drag and drop) on a session's page, and for the first message on a project's
// page (attachments.js).

import { AttachmentTray, filesOf } from './attachments.js';
import { mentionsIn, rememberMentions } from './mentions.js';
import { h } from './dom.js';

export class Composer {
  // `maxBytes`: the server's attachment size limit (the page's data).
  constructor(root, { onSend, onStop, maxBytes = null }) {
    this.root = root;
    this.onSend = onSend;
    this.onStop = onStop;
    this.defaultMode = 'queue';
    this.mode = 'queue';
    this.active = false;
    this.canStop = false;
    this.commands = [];
    this.paletteIndex = 0;
    this.paletteItems = [];
    this.disabledReason = null;
    this.lock = null;
    this.failedNote = false;

    this.textarea = root.querySelector('textarea');
    this.sendButton = root.querySelector('[data-role=send]');
    this.stopButton = root.querySelector('[data-role=stop]');
    this.modeBox = root.querySelector('[data-role=mode]');
    this.palette = root.querySelector('[data-role=palette]');
    this.note = root.querySelector('[data-role=note]');
    this.row = root.querySelector('[data-role=composer-row]');
    this.lockBox = root.querySelector('[data-role=lock]');
    this.lockText = root.querySelector('[data-role=lock-text]');
    this.lockButton = root.querySelector('[data-role=lock-action]');
    this.lockButton.addEventListener('click', () => this.unlock());
    this.modeButtons = [...this.modeBox.querySelectorAll('button[data-mode]')];
    this.setUpAttachments(maxBytes);
    // The hint follows the box's width (a phone's is too narrow for the desktop's hint).
    new ResizeObserver(() => this.renderHint()).observe(this.textarea);

    this.textarea.addEventListener('keydown', (event) => this.onKey(event));
    this.textarea.addEventListener('input', () => {
      this.autosize();
      this.updatePalette();
    });
    this.textarea.addEventListener('blur', () => setTimeout(() => this.closePalette(), 150));
    root.addEventListener('submit', (event) => {
      event.preventDefault();
      this.submit();
    });
    this.stopButton.addEventListener('click', () => this.onStop());
    for (const button of this.modeButtons) button.addEventListener('click', () => this.setMode(button.dataset.mode));
    this.render();
  }

  // Files can be attached once there is a session to upload them to.
  enableAttachments(sessionId) {
    this.tray.enable(sessionId);
  }

  // A project's page: files are attached before the first message creates the session.
  deferAttachments() {
    this.tray.defer();
  }

  // Before the first message creates a session: rejects naming a file the server would refuse.
  checkAttachments() {
    return this.tray.check();
  }

  // That session now exists: the files go up to it; resolves with what the message names.
  uploadAttachments(sessionId) {
    return this.tray.uploadTo(sessionId);
  }

  setUpAttachments(maxBytes) {
    this.attachButton = this.root.querySelector('[data-role=attach]');
    this.fileInput = this.root.querySelector('[data-role=file-input]');
    this.tray = new AttachmentTray(this.root.querySelector('[data-role=attachments]'), {
      maxBytes,
      onChange: () => this.trayChanged(),
    });
    this.attachButton.addEventListener('click', () => this.fileInput.click());
    this.fileInput.addEventListener('change', () => {
      this.tray.add([...this.fileInput.files]);
      this.fileInput.value = '';
      this.textarea.focus();
    });
    this.textarea.addEventListener('paste', (event) => {
      const files = filesOf(event.clipboardData);
      if (!files.length || !this.canAttach()) return;
      event.preventDefault();
      this.tray.add(files);
    });
    const carriesFiles = (event) => [...(event.dataTransfer?.types || [])].includes('Files');
    this.root.addEventListener('dragover', (event) => {
      if (!carriesFiles(event) || !this.canAttach()) return;
      event.preventDefault();
      this.root.dataset.dropping = 'true';
    });
    this.root.addEventListener('dragleave', (event) => {
      if (!this.root.contains(event.relatedTarget)) delete this.root.dataset.dropping;
    });
    this.root.addEventListener('drop', (event) => {
      delete this.root.dataset.dropping;
      const files = filesOf(event.dataTransfer);
      if (!files.length || !this.canAttach()) return;
      event.preventDefault();
      this.tray.add(files);
    });
  }

  // A note about failed files follows the tray: it goes once none is left (removed, or uploaded again).
  trayChanged() {
    if (this.failedNote) this.noteFailed();
    this.render();
  }

  // Says which files would be left out of a message sent now, and what to do; false when none.
  noteFailed() {
    const failed = this.tray.failed();
    if (!failed.length) {
      if (this.failedNote) this.setNote(null);
      this.failedNote = false;
      return false;
    }
    this.failedNote = true;
    const [them, each] = failed.length === 1 ? ['it', 'it'] : ['them', 'each'];
    const fix = failed.some((item) => item.retryable) ? `Retry (↻) or remove (×) ${them}` : `Remove ${them} (×)`;
    const names = failed.map((item) => item.attachment.name).join(', ');
    this.setNote(`Not sent: ${names} could not be attached (the reason is on ${each}). ${fix}, then send.`);
    return true;
  }

  canAttach() {
    return this.tray.enabled && !this.disabledReason && !this.lock;
  }

  setDefaultMode(mode) {
    this.defaultMode = mode === 'steer' ? 'steer' : 'queue';
    this.mode = this.defaultMode;
    this.render();
  }

  setMode(mode) {
    this.mode = mode;
    this.render();
    this.textarea.focus();
  }

  setActive(active, { canStop = active } = {}) {
    if (active && !this.active) this.mode = this.defaultMode;
    this.active = active;
    this.canStop = canStop;
    this.render();
  }

  setCommands(commands) {
    this.commands = Array.isArray(commands) ? commands.filter((c) => c && c.name) : [];
    this.updatePalette();
  }

  setDisabled(reason) {
    this.disabledReason = reason;
    this.render();
  }

  // Read-only (an archived session or project): `lock` {text, action, run} says why and offers
  // the way back in place of the message box; null takes messages again. A draft is kept.
  setLocked(lock) {
    const had = !!this.lock;
    this.lock = lock;
    this.lockText.textContent = lock?.text || '';
    this.lockButton.textContent = lock?.action || '';
    this.lockButton.hidden = !lock?.action;
    this.lockButton.disabled = false;
    this.render();
    if (had && !lock && this.root.contains(document.activeElement)) this.textarea.focus();
  }

  async unlock() {
    if (!this.lock?.run) return;
    this.lockButton.disabled = true;
    try {
      await this.lock.run();
    } catch (error) {
      this.setNote(`Could not restore: ${error.message}`);
      this.lockButton.disabled = false;
    }
  }

  setNote(text) {
    this.note.textContent = text || '';
    this.note.hidden = !text;
  }

  render() {
    this.modeBox.hidden = !this.active;
    for (const button of this.modeButtons) {
      button.setAttribute('aria-pressed', String(button.dataset.mode === this.mode));
    }
    this.stopButton.hidden = !this.active;
    this.stopButton.disabled = !this.canStop;
    this.sendButton.textContent = !this.active ? 'Send' : this.mode === 'steer' ? 'Steer' : 'Queue';
    this.sendButton.dataset.mode = this.active ? this.mode : 'send';
    this.lockBox.hidden = !this.lock;
    this.row.hidden = !!this.lock;
    this.root.dataset.locked = this.lock ? this.lock.kind || 'locked' : '';
    this.textarea.disabled = !!this.disabledReason || !!this.lock;
    // Uploads still running: the message waits for them (their ids are not known yet).
    this.sendButton.disabled = !!this.disabledReason || !!this.lock || this.tray.busy;
    this.attachButton.hidden = !this.tray.enabled;
    this.attachButton.disabled = !this.canAttach();
    this.renderHint();
  }

  // The placeholder's wordings, longest first.
  hints() {
    if (this.disabledReason) return [this.disabledReason];
    if (this.active && this.mode === 'steer') return ['Guide the running agent (Steer)…', 'Steer the agent…', 'Steer…'];
    if (this.active) return ['Queue a message for after this run…', 'Queue a message…', 'Queue…'];
    return [
      'Message the agent — Enter to send, Shift+Enter for a new line, / for commands',
      'Message the agent (/ for commands)',
      'Message (/ for commands)',
      'Message…',
    ];
  }

  // The longest hint that fits the box's one line: a longer one wraps and is cut off.
  renderHint() {
    const hints = this.hints();
    const style = getComputedStyle(this.textarea);
    const room = this.textarea.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    this.measure ??= document.createElement('canvas').getContext('2d');
    this.measure.font = `${style.fontStyle} ${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
    // Not laid out (hidden): the longest; the box's next resize picks again.
    const fits = room > 0 ? hints.find((hint) => this.measure.measureText(hint).width <= room) : hints[0];
    this.textarea.placeholder = fits ?? hints[hints.length - 1];
  }

  autosize() {
    this.textarea.style.height = 'auto';
    this.textarea.style.height = `${Math.min(this.textarea.scrollHeight, 320)}px`;
  }

  onKey(event) {
    if (!this.palette.hidden && this.paletteItems.length) {
      if (event.key === 'ArrowDown' || event.key === 'ArrowUp') {
        event.preventDefault();
        const step = event.key === 'ArrowDown' ? 1 : -1;
        this.paletteIndex = (this.paletteIndex + step + this.paletteItems.length) % this.paletteItems.length;
        this.renderPalette();
        return;
      }
      if (event.key === 'Tab' || (event.key === 'Enter' && !event.shiftKey)) {
        event.preventDefault();
        this.choose(this.paletteItems[this.paletteIndex]);
        return;
      }
      if (event.key === 'Escape') {
        event.preventDefault();
        this.closePalette();
        return;
      }
    }
    if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      this.submit();
    }
  }

  submit() {
    const text = this.textarea.value;
    if (!text.trim() || this.disabledReason || this.lock || this.tray.busy) return;
    // Never sent without a file the user attached: the text and the other files stay.
    if (this.noteFailed()) return;
    const mode = this.active ? this.mode : 'auto';
    // `@` paths chosen from the list and still in the text go beside the uploads (mentions.js).
    const attachments = [...this.tray.ready(), ...mentionsIn(text)];
    this.textarea.value = '';
    this.autosize();
    this.closePalette();
    // Files still waiting for a session stay: the first message uploads them (main.js).
    if (!this.tray.deferred) this.tray.clear();
    this.mode = this.defaultMode;
    this.render();
    this.onSend(text, mode, attachments);
  }

  focus() {
    this.textarea.focus();
    const end = this.textarea.value.length;
    this.textarea.setSelectionRange(end, end);
  }

  // Nothing typed and no palette open: a key pressed here is not part of typing a message.
  idle(target) {
    return target === this.textarea && !this.textarea.value && this.palette.hidden;
  }

  // Put text and attachments back (a refused message), so nothing the user wrote is lost.
  restore(text, attachments = []) {
    if (!this.textarea.value.trim()) this.textarea.value = text;
    else this.textarea.value = `${text}\n${this.textarea.value}`;
    this.tray.restore(attachments.filter((a) => a.id));
    rememberMentions(attachments);
    this.autosize();
    this.textarea.focus();
  }

  // ---------------------------------------------------------------- palette

  updatePalette() {
    const value = this.textarea.value;
    const match = /^\/(\S*)$/.exec(value);
    if (!match || !this.commands.length) {
      this.closePalette();
      return;
    }
    const prefix = match[1].toLowerCase();
    this.paletteItems = this.commands.filter((c) => c.name.toLowerCase().startsWith(prefix));
    this.paletteIndex = Math.min(this.paletteIndex, Math.max(0, this.paletteItems.length - 1));
    if (!this.paletteItems.length) {
      this.closePalette();
      return;
    }
    this.renderPalette();
  }

  renderPalette() {
    this.palette.hidden = false;
    this.palette.replaceChildren(
      ...this.paletteItems.map((command, index) =>
        h(
          'li',
          {
            role: 'option',
            id: `palette-${index}`,
            'aria-selected': String(index === this.paletteIndex),
            dataset: { command: command.name },
            onmousedown: (event) => {
              event.preventDefault();
              this.choose(command);
            },
          },
          h('span', { class: 'cmd-name', text: `/${command.name}` }),
          command.input_hint ? h('span', { class: 'cmd-hint', text: ` ${command.input_hint}` }) : null,
          command.description ? h('span', { class: 'cmd-desc', text: command.description }) : null,
        ),
      ),
    );
    this.textarea.setAttribute('aria-activedescendant', `palette-${this.paletteIndex}`);
  }

  closePalette() {
    this.palette.hidden = true;
    this.paletteItems = [];
    this.paletteIndex = 0;
    this.textarea.removeAttribute('aria-activedescendant');
  }

  choose(command) {
    if (!command) return;
    this.textarea.value = `/${command.name} `;
    this.closePalette();
    this.textarea.focus();
    this.textarea.setSelectionRange(this.textarea.value.length, this.textarea.value.length);
  }
}
