// Rewind a turn's files, and undo a rewind or restore (docs/workspace.md, "Rewind and restore").
//
// A rewind asks first: a dry run lists the files it would put back and those something else
// changed since (the user's editor, another session), and the confirmation says so — with
// "Rewind anyway" (force) when there are any. One client_id per confirmation, so a repeated
// click is answered `duplicate`. What was done arrives as the session's journaled item
// (changes.js renderFilesRestored) through the socket, like any turn.

import { api, ApiError, NetworkError } from './api.js';
import { formDialog } from './dialogs.js';
import { h, uuid } from './dom.js';

// Paths listed in a confirmation; more are counted.
const LISTED = 50;

function pathList(paths, cls) {
  const shown = paths.slice(0, LISTED);
  return [
    h('ul', { class: `rewind-paths ${cls}` }, shown.map((path) => h('li', { text: path }))),
    paths.length > shown.length ? h('p', { class: 'hint', text: `and ${paths.length - shown.length} more` }) : null,
  ];
}

// A message in a dialog of its own (a refusal said plainly, or nothing to do).
function tell(title, message) {
  const dialog = formDialog(title, [h('p', { class: 'rewind-message', text: message })], 'OK', async () => true);
  dialog.classList.add('rewind-dialog');
  dialog.querySelector('button[value=cancel]').remove();
  dialog.showModal();
  return dialog;
}

function reason(error) {
  if (error instanceof NetworkError) return 'The server could not be reached; nothing was changed. Try again.';
  if (error instanceof ApiError && error.code === 'session_busy') return 'A turn of this session is running. Rewind when it has ended.';
  return error.message || String(error);
}

// Confirm and run `send({client_id, force})`: the files listed, the conflicting ones apart with
// an explicit "… anyway". Resolves to the answer, or null when cancelled.
function confirmRestore({ title, intro, paths, conflicts, label, send }) {
  return new Promise((resolve) => {
    let answer = null;
    const clientId = uuid();
    let force = conflicts.length > 0;
    const conflictBox = h('div', { class: 'rewind-conflicts', role: 'alert', hidden: !conflicts.length });
    const showConflicts = (list) => {
      conflictBox.hidden = !list.length;
      conflictBox.replaceChildren(
        h('p', { text: 'Changed since by something else (your editor, another session) — these will be overwritten:' }),
        ...pathList(list, 'conflicting').filter(Boolean),
      );
    };
    if (conflicts.length) showConflicts(conflicts);
    const error = h('p', { class: 'form-error', role: 'alert' });
    const body = [h('p', { text: intro }), ...pathList(paths, 'restoring'), conflictBox, error];
    const dialog = formDialog(title, body, force ? `${label} anyway` : label, async () => {
      try {
        answer = await send({ client_id: clientId, force });
        return true;
      } catch (failure) {
        if (failure instanceof ApiError && failure.code === 'rewind_conflict') {
          showConflicts(failure.details?.paths || []);
          force = true;
          submit.textContent = `${label} anyway`;
          return false;
        }
        error.textContent = reason(failure);
        return false;
      }
    });
    const submit = dialog.querySelector('button[type=submit]');
    submit.classList.add('danger');
    dialog.classList.add('wide', 'rewind-dialog');
    dialog.addEventListener('close', () => resolve(answer));
    dialog.showModal();
  });
}

export async function rewindTurn(runId) {
  let preview;
  try {
    preview = await api.rewind(runId, { client_id: uuid(), dry_run: true });
  } catch (error) {
    if (error instanceof ApiError && error.code === 'no_checkpoint') return tell('Nothing to rewind', 'This turn has no checkpoint of the files before it (checkpoints were off).');
    return tell('Cannot rewind now', reason(error));
  }
  if (!preview.restored.length) return tell('Nothing to rewind', 'The files are as they were before this turn.');
  const count = preview.restored.length;
  return confirmRestore({
    title: 'Rewind files to before this turn?',
    intro: `${count === 1 ? 'This file goes' : `These ${count} files go`} back to what ${count === 1 ? 'it' : 'they'} held before this turn (later turns' changes to them too). Undo puts them back.`,
    paths: preview.restored,
    conflicts: preview.conflicts || [],
    label: 'Rewind files',
    send: (body) => api.rewind(runId, body),
  });
}

// Undo a rewind or restore: restore the checkpoint of the tree it replaced. The button is busy
// while the request is out; `note` says what came of it.
export async function undoRestore(checkpointId, button, note) {
  if (button.disabled) return null;
  button.disabled = true;
  note.textContent = '';
  const send = (body) => api.restoreCheckpoint(checkpointId, body);
  try {
    return await send({ client_id: uuid() });
  } catch (error) {
    if (error instanceof ApiError && error.code === 'rewind_conflict') {
      const paths = error.details?.paths || [];
      return await confirmRestore({
        title: 'Undo anyway?',
        intro: 'Undo puts the files back as they were before. Some changed since:',
        paths: [],
        conflicts: paths,
        label: 'Undo',
        send,
      });
    }
    note.textContent = reason(error);
    return null;
  } finally {
    button.disabled = false;
  }
}
