// The open session's controls on its runs and queue: Stop, an approval's options, a question's
// answer, and the pending-intent cards' actions (edit, reorder, delete, steer, stop-and-send).
// The server's answer shows where the control was used; the state itself comes as events.

import { api } from './api.js';

export class RunControls {
  // `activeRunId()`: the run Stop, Steer and Stop-and-send act on (undefined when none is).
  constructor({ sessionId, composer, intents, activeRunId }) {
    this.sessionId = sessionId;
    this.composer = composer;
    this.intents = intents;
    this.activeRunId = activeRunId;
  }

  async stop() {
    const runId = this.activeRunId();
    if (!runId) return;
    try {
      const result = await api.cancel(runId);
      if (!result.accepted && result.status !== 'duplicate') this.composer.setNote(result.message);
    } catch (error) {
      this.composer.setNote(`Stop failed: ${error.message}`);
    }
  }

  async approve(view, item, option) {
    const key = `approval:${item.approval_id}`;
    view.markBusy(key, true);
    view.setControlMessage(key, null);
    view.redraw(item);
    let keepBusy = false;
    try {
      const result = await api.approve(view.runId, item.approval_id, option.option_id);
      if (result.accepted || result.status === 'duplicate') {
        keepBusy = true; // the buttons go when approval.resolved arrives
        view.setControlMessage(key, `Sent: ${option.name}`);
      } else {
        view.setControlMessage(key, result.message);
      }
    } catch (error) {
      view.setControlMessage(key, error.message);
    }
    view.markBusy(key, keepBusy);
    view.redraw(item);
  }

  async clarify(view, item, answer) {
    view.clarifyFeedback(item, true, null);
    try {
      const result = await api.clarify(view.runId, item.clarify_id, answer);
      if (result.accepted || result.status === 'duplicate') view.clarifyFeedback(item, true, 'Answer sent.');
      else view.clarifyFeedback(item, false, result.message);
    } catch (error) {
      view.clarifyFeedback(item, false, error.message);
    }
  }

  // Pending-intent actions; returns a note to show on the card, or null.
  async intentAction(action, intent, extra) {
    let note = null;
    try {
      let result = null;
      if (action === 'edit') result = await api.editIntent(intent.id, { version: intent.version, text: extra.text });
      else if (action === 'up' || action === 'down') result = await api.editIntent(intent.id, { version: intent.version, position: extra.position });
      else if (action === 'delete') result = await api.deleteIntent(intent.id, intent.version);
      else if (action === 'steer') result = await api.steerIntent(intent.id, this.activeRunId());
      else if (action === 'stop-and-send') result = await api.stopAndSend(intent.id, this.activeRunId());
      if (result && !['accepted', 'duplicate'].includes(result.status)) note = result.message;
    } catch (error) {
      // A 409 carries the item as it is now; the list below is re-read either way.
      note = error.message;
    }
    try {
      this.intents.setIntents(await api.intents(this.sessionId));
    } catch {
      // The socket's next session message brings the list.
    }
    return note;
  }
}
