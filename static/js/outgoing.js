// What the composer sent and the server has not taken yet: shown at once under the transcript
// ("sending…"), kept in the outbox (outbox.js) until the server has it as a turn or an intent,
// posted over the socket when it is open and over HTTP otherwise. Not sent: Retry and Discard;
// refused: the reason, Edit and Dismiss.

import { api, ApiError, NetworkError } from './api.js';
import { renderAttachmentList } from './attachments.js';
import { h, uuid } from './dom.js';
import { outbox } from './outbox.js';

export class Outgoing {
  // `submit(body)`: the socket's answer, or null to go over HTTP; `onAccepted(entry, result)` and
  // `onRefused(error)` follow the server's answer.
  constructor(list, { sessionId, empty, composer, submit, onAccepted, onRefused }) {
    this.list = list;
    this.sessionId = sessionId;
    this.empty = empty;
    this.composer = composer;
    this.submit = submit;
    this.onAccepted = onAccepted;
    this.onRefused = onRefused;
  }

  // A new message: in the outbox and shown as sending; post it next.
  add(text, mode, attachments = []) {
    const entry = { client_id: uuid(), session_id: this.sessionId, text, mode, attachments, created_at: Date.now() };
    outbox.add(entry);
    this.show(entry, 'sending');
    return entry;
  }

  // What an earlier page of this session left unsent (a reload, the project page's first message).
  resume() {
    for (const entry of outbox.list(this.sessionId)) {
      this.show(entry, 'sending');
      this.post(entry);
    }
  }

  // Live again: what could not be sent goes now.
  retryFailed() {
    for (const entry of outbox.list(this.sessionId)) if (entry.failed) this.post(entry);
  }

  async post(entry) {
    this.show(entry, 'sending');
    try {
      const body = { client_id: entry.client_id, text: entry.text, mode: entry.mode };
      const uploads = (entry.attachments || []).filter((a) => a.id);
      const mentions = (entry.attachments || []).filter((a) => a.mention).map((a) => a.mention);
      if (uploads.length) body.attachments = uploads.map((a) => a.id);
      if (mentions.length) body.mentions = mentions; // `@` paths (mentions.js)
      // Over the socket when it is open; over HTTP when it is not, or could not tell.
      const result = (await this.submit(body)) ?? (await api.submitMessage(this.sessionId, body));
      outbox.remove(entry.client_id);
      this.remove(entry.client_id);
      this.onAccepted(entry, result);
    } catch (error) {
      if (error instanceof NetworkError || (error instanceof ApiError && (error.status >= 500 || error.status === 401))) {
        // Same client_id on retry: the server dedupes, so a retry never makes a second turn.
        // Signed out: kept, and sent again once the page is live after signing in.
        outbox.update(entry.client_id, { failed: true });
        const why = error.status === 401 ? 'signed out; it is sent once you sign in again' : 'the server could not be reached';
        this.show(entry, 'failed', `Not sent: ${why}.`);
      } else {
        outbox.remove(entry.client_id);
        this.show(entry, 'refused', error.message);
        this.onRefused(error);
      }
    }
  }

  // The server has this message as a turn: it is acknowledged whatever happened to the POST's answer.
  acknowledged(clientId) {
    this.remove(clientId);
    outbox.remove(clientId);
  }

  show(entry, state, message = '') {
    let node = this.list.querySelector(`[data-client-id="${CSS.escape(entry.client_id)}"]`);
    const actions = [];
    if (state === 'failed') {
      actions.push(h('button', { type: 'button', class: 'btn small', text: 'Retry', onclick: () => this.post(entry) }));
      actions.push(h('button', { type: 'button', class: 'btn small', text: 'Discard', onclick: () => (outbox.remove(entry.client_id), this.remove(entry.client_id)) }));
    } else if (state === 'refused') {
      actions.push(h('button', { type: 'button', class: 'btn small', text: 'Edit', onclick: () => (this.remove(entry.client_id), this.composer.restore(entry.text, entry.attachments)) }));
      actions.push(h('button', { type: 'button', class: 'btn small', text: 'Dismiss', onclick: () => this.remove(entry.client_id) }));
    }
    const label = { sending: 'sending…', failed: 'not sent', refused: 'refused' }[state];
    const fresh = h(
      'div',
      { class: 'outgoing', dataset: { clientId: entry.client_id, state } },
      h('div', { class: 'bubble user-text', text: entry.text }),
      renderAttachmentList(entry.attachments),
      h('div', { class: 'outgoing-status' }, h('span', { text: label }), message ? h('span', { class: 'reason', text: ` — ${message}` }) : null, actions),
    );
    if (node) node.replaceWith(fresh);
    else this.list.append(fresh);
    this.empty.hidden = true;
  }

  remove(clientId) {
    this.list.querySelector(`[data-client-id="${CSS.escape(clientId)}"]`)?.remove();
  }
}
