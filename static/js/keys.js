// The key map: single keys that act on the page, never while the user types in a field.
//
// Esc stops the running turn (also from an empty message box), 1–9 answer the open
// approval with that option, / focuses the message box, j / k go to the next /
// previous turn, ? shows this map in a dialog.

import { h } from './dom.js';

export const KEYMAP = [
  [['Esc'], 'Stop the running turn (outside a field, or in an empty message box)'],
  [['1', '…', '9'], 'Answer the open approval with that option'],
  [['/'], 'Go to the message box'],
  [['k'], 'Previous turn'],
  [['j'], 'Next turn'],
  [['?'], 'Show these shortcuts'],
  [['Enter'], 'In the message box: send'],
  [['Shift', '+', 'Enter'], 'In the message box: new line'],
];

function typingIn(target) {
  return !!target?.closest?.('input, textarea, select, [contenteditable]:not([contenteditable="false"])');
}

export function showKeyMap() {
  const heading = h('h2', { id: 'keymap-title', text: 'Keyboard shortcuts' });
  const dialog = h(
    'dialog',
    { class: 'dialog keymap', 'aria-labelledby': 'keymap-title', dataset: { role: 'keymap' } },
    heading,
    h(
      'table',
      { class: 'keymap-table' },
      h('thead', {}, h('tr', {}, h('th', { scope: 'col', text: 'Key' }), h('th', { scope: 'col', text: 'Does' }))),
      h(
        'tbody',
        {},
        KEYMAP.map(([keys, what]) =>
          h('tr', {}, h('td', {}, keys.map((k) => (k === '+' || k === '…' ? ` ${k} ` : h('kbd', { text: k })))), h('td', { text: what })),
        ),
      ),
    ),
    h('form', { method: 'dialog', class: 'dialog-actions' }, h('button', { type: 'submit', class: 'btn primary', text: 'Close' })),
  );
  dialog.addEventListener('close', () => dialog.remove());
  document.body.append(dialog);
  dialog.showModal();
  return dialog;
}

// `actions`: {stop(), canStop(), answer(n), focusComposer(), jump(dir), composerIdle(target), closeNav()}.
export function installKeyMap(actions) {
  document.addEventListener('keydown', (event) => {
    if (event.defaultPrevented || event.isComposing || event.ctrlKey || event.metaKey || event.altKey) return;
    if (document.querySelector('dialog[open]')) return; // a dialog has the keys (Esc closes it)
    const target = event.target;
    if (event.key === 'Escape') {
      if (actions.closeNav()) return;
      if (typingIn(target) && !actions.composerIdle(target)) return;
      if (actions.canStop()) {
        event.preventDefault();
        actions.stop();
      }
      return;
    }
    if (typingIn(target)) return;
    if (/^[1-9]$/.test(event.key)) {
      if (actions.answer(Number(event.key))) event.preventDefault();
      return;
    }
    switch (event.key) {
      case '/':
        event.preventDefault();
        actions.focusComposer();
        break;
      case '?':
        event.preventDefault();
        showKeyMap();
        break;
      case 'j':
        if (actions.jump(1)) event.preventDefault();
        break;
      case 'k':
        if (actions.jump(-1)) event.preventDefault();
        break;
      default:
        break;
    }
  });
}
