// The open session's live events, from the socket or read over HTTP, onto its turns
// (docs/ui.md, "Live updates"). Every event goes through one gate: at or below the run's
// cursor it is dropped (a replay overlap), one above it is applied, further ahead it waits
// while the gap is read from GET /api/runs/{id}/events. Applied events are drawn once per
// animation frame; a settled turn's rendered markdown is then asked for (the fragments).

import { api, ApiError, fetchFragments } from './api.js';

const POLL_MIN_MS = 2000;

export class TurnFeed {
  // `turns`: the controller's Map of run id → TurnView, read here, never replaced.
  constructor({ sessionId, turns, resync, reload, onTitle, onDrawn, onRendered }) {
    this.sessionId = sessionId;
    this.turns = turns;
    this.resync = resync; // a run we do not hold: the transcript is read again
    this.reload = reload; // the cursor is gone: the transcript is read from scratch
    this.onTitle = onTitle;
    this.onDrawn = onDrawn; // after each flush: the derived state and the scroll follow
    this.onRendered = onRendered; // rendered fragments were laid over turns
    this.buffered = new Map();
    this.repairing = new Set();
    this.dirty = new Set();
    this.held = new Set(); // views whose drawing waits on a timer (holdFlush)
    this.flushScheduled = false;
    this.needsFragment = new Set();
    this.fragmentTimer = null;
    this.lastPoll = 0;
  }

  // Where each run still going is: the socket subscribes from there (`{run_id: last_seq}`).
  cursors() {
    const after = {};
    for (const view of this.turns.values()) if (!view.terminal) after[view.runId] = view.lastSeq;
    return after;
  }

  // No socket: keep the page moving over HTTP (the events endpoint has the same semantics).
  async poll() {
    if (Date.now() - this.lastPoll < POLL_MIN_MS) return;
    this.lastPoll = Date.now();
    const open = [...this.turns.values()].filter((v) => !v.terminal);
    try {
      await Promise.all(open.map((view) => this.repair(view)));
      if (open.some((v) => v.terminal)) await this.resync();
    } catch {
      // The server is down too; the socket's backoff keeps trying.
    }
  }

  // A turn just added: a settled one waits for its rendered markdown, a live one is drawn as it goes.
  watch(view) {
    if (view.terminal) this.needsFragment.add(view.runId);
    else view.el.dataset.rendered = 'false';
  }

  onEvent(event) {
    if (event.session_id !== undefined && Number(event.session_id) !== this.sessionId) return;
    const view = this.turns.get(event.run_id);
    if (!view) {
      // A run we have not seen (drained from the queue, another tab's message): read the transcript.
      this.buffer(event);
      this.resync();
      return;
    }
    if (this.repairing.has(view.runId)) {
      this.buffer(event);
      return;
    }
    if (event.seq <= view.lastSeq) return;
    if (event.seq > view.lastSeq + 1) {
      this.buffer(event);
      this.repair(view);
      return;
    }
    this.applyTo(view, event);
  }

  buffer(event) {
    const list = this.buffered.get(event.run_id) || [];
    list.push(event);
    this.buffered.set(event.run_id, list);
  }

  drainBuffered(view) {
    const list = this.buffered.get(view.runId);
    if (!list) return;
    this.buffered.delete(view.runId);
    list.sort((a, b) => a.seq - b.seq);
    for (let i = 0; i < list.length; i++) {
      const event = list[i];
      if (event.seq <= view.lastSeq) continue;
      if (event.seq > view.lastSeq + 1) {
        for (const rest of list.slice(i)) this.buffer(rest);
        this.repair(view);
        return;
      }
      this.applyTo(view, event);
    }
  }

  // Read a run's missing events over HTTP (a seq gap, or no socket at all).
  async repair(view) {
    if (this.repairing.has(view.runId)) return;
    this.repairing.add(view.runId);
    try {
      for (let page = 0; page < 100; page++) {
        const result = await api.runEvents(view.runId, view.lastSeq);
        for (const event of result.events) if (event.seq === view.lastSeq + 1) this.applyTo(view, event);
        if (!result.has_more || !result.events.length) break;
      }
    } catch (error) {
      if (error instanceof ApiError && (error.code === 'cursor_expired' || error.code === 'cursor_ahead')) {
        this.repairing.delete(view.runId);
        await this.reload();
        return;
      }
    } finally {
      this.repairing.delete(view.runId);
    }
    this.drainBuffered(view);
  }

  applyTo(view, event) {
    if (!view.apply(event)) return;
    this.draw(view);
    switch (event.type) {
      case 'done':
        if (view.tooLarge) {
          view.el.dataset.rendered = 'plain';
          break;
        }
        this.needsFragment.add(view.runId);
        this.requestFragments();
        break;
      case 'title.updated':
        this.onTitle(event.payload?.title);
        break;
      default:
        break;
    }
  }

  // The turn is drawn again on the next flush.
  draw(view) {
    this.dirty.add(view);
    this.scheduleFlush();
  }

  scheduleFlush() {
    if (this.flushScheduled) return;
    this.flushScheduled = true;
    // Animation frames stop in a hidden tab; a timer keeps state (and notifications) current there.
    const run = () => this.flush();
    if (document.hidden) setTimeout(run, 250);
    else requestAnimationFrame(run);
  }

  flush() {
    this.flushScheduled = false;
    const views = [...this.dirty];
    this.dirty.clear();
    for (const view of views) {
      const wait = view.holdFor();
      if (wait > 0) this.holdFlush(view, wait);
      else if (view.flush()) this.dirty.add(view); // a costly text, left for a later frame
    }
    this.onDrawn();
    if (this.dirty.size) this.scheduleFlush();
  }

  // A turn catching up on a replay is drawn later (TurnView.holdFor); its events are applied meanwhile.
  holdFlush(view, wait) {
    if (this.held.has(view)) return;
    this.held.add(view);
    setTimeout(() => {
      this.held.delete(view);
      this.draw(view);
    }, wait);
  }

  // ---------------------------------------------------------------- rendered fragments

  requestFragments() {
    clearTimeout(this.fragmentTimer);
    this.fragmentTimer = setTimeout(() => this.loadFragments(), 30);
  }

  async loadFragments() {
    const ids = [...this.needsFragment].filter((id) => this.turns.get(id)?.terminal);
    if (!ids.length) return;
    let sections;
    try {
      sections = await fetchFragments(this.sessionId, ids);
    } catch {
      setTimeout(() => this.requestFragments(), 3000);
      return;
    }
    const settled = this.applyFragments(new Map(ids.filter((id) => sections.has(id)).map((id) => [id, sections.get(id)])));
    // An answer stops at the server's page budget: ask again for the turns that did not come.
    if (settled && ids.some((id) => !sections.has(id))) this.requestFragments();
    this.onRendered();
  }

  // Apply rendered turns; how many turns were settled by it (rendered, or found too large to).
  applyFragments(sections) {
    let settled = 0;
    for (const [runId, section] of sections) {
      const view = this.turns.get(runId);
      if (!view) continue;
      // An ended run too large to render stays so: once caught up, it is settled without asking again.
      if (section.hasAttribute('data-too-large') && view.catchingUp) view.tooLarge = true;
      if (section.hasAttribute('data-too-large') && view.terminal) {
        // Too large to render in one answer: the turn keeps its plain text.
        view.el.dataset.rendered = 'plain';
        this.needsFragment.delete(runId);
        settled += 1;
      } else if (view.terminal && Number(section.dataset.lastSeq) === view.lastSeq) {
        view.applyFragment(section);
        view.el.dataset.rendered = 'true';
        this.needsFragment.delete(runId);
        settled += 1;
      }
    }
    return settled;
  }
}
