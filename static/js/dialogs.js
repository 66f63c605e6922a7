// Modal dialogs (`<dialog>` with a form): the sidebar's forms, confirmations and alerts. Each is
// removed from the page once closed.

import { h } from './dom.js';

let dialogs = 0;

// `onSubmit(form)` answers whether the dialog is done (true: it closes; false: it stays, its
// error shown).
export function formDialog(title, body, submitLabel, onSubmit) {
  const titleId = `dialog-title-${++dialogs}`;
  const dialog = h('dialog', { class: 'dialog', 'aria-labelledby': titleId });
  const form = h(
    'form',
    { method: 'dialog' },
    h('h2', { id: titleId, text: title }),
    body,
    h('div', { class: 'dialog-actions' }, h('button', { type: 'button', class: 'btn', value: 'cancel', text: 'Cancel', onclick: () => dialog.close() }), h('button', { type: 'submit', class: 'btn primary', text: submitLabel })),
  );
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const button = form.querySelector('button[type=submit]');
    for (const error of form.querySelectorAll('.form-error')) error.textContent = '';
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
