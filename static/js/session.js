// The open session: transcript, live events, composer, pending intents.
//
// Loading order (docs/ui.md, "Live updates"): the transcript from the API
// first, then the socket subscribes with `{run_id: last_seq}` of every run
// still going, so a reload mid-run shows exactly what an uninterrupted page
// shows. Every event goes through one gate: at or below the run's cursor it
// is dropped (a replay overlap), one above it is applied, further ahead it
// waits while the gap is read from GET /api/runs/{id}/events.

import { api, ApiError, fetchFragments, NetworkError, toLogin } from './api.js';
import { composerLock } from './archive.js';
import { renderAttachmentList } from './attachments.js';
import { h, uuid } from './dom.js';
import { askPermissionOnce } from './notify.js';
import { outbox } from './outbox.js';
import { emptyState } from './runstate.js';
import { sessionTitle } from './sidebar.js';
import { SessionSocket } from './socket.js';
import { TurnView } from './transcript.js';

const POLL_MIN_MS = 2000;

export class SessionController {
  constructor({ data, els, status, composer, intents, sidebar }) {
    this.session = { ...data.session };
    this.sessionId = data.session.id;
    this.project = data.project;
    this.els = els;
    this.status = status;
    this.composer = composer;
    this.intents = intents;
    this.sidebar = sidebar;
    this.turns = new Map();
    this.buffered = new Map();
    this.repairing = new Set();
    this.dirty = new Set();
    this.held = new Set(); // views whose drawing waits on a timer (holdFlush)
    this.flushScheduled = false;
    this.needsFragment = new Set();
    this.fragmentTimer = null;
    this.resyncing = null;
    this.resyncAgain = false;
    this.lastPoll = 0;
    this.agentTitle = null;
    this.lockKind = null;
    // The transcript comes a page at a time, newest first (docs/ui.md, "Long sessions"):
    // `before` is the cursor of the next older page, `loading` the request under way.
    this.earlier = { before: null, hasMore: false, loading: null, failed: false };
    this.earlierEl = this.buildEarlier();
    els.transcript.prepend(this.earlierEl);
    this.handlers = {
      approve: (view, item, option) => this.approve(view, item, option),
      clarify: (view, item, answer) => this.clarify(view, item, answer),
      retry: (view) => this.retry(view),
      edit: (view) => this.composer.restore(view.turn.prompt_text || '', view.turn.attachments || []),
    };
    // Follow the stream only while the reader is at the bottom; a reader who scrolled up stays put.
    this.stick = true;
    this.autoScrollTop = 0; // where scrollToBottom last put the view
    // Only the reader moving up unsticks: text laid out below the view (its size known only once
    // shown: .md.plain's content-visibility, chunks) moves the bottom away without anyone scrolling.
    els.scroller.addEventListener(
      'scroll',
      () => {
        this.stick = this.atBottom() || els.scroller.scrollTop >= this.autoScrollTop - 2;
        if (!this.stick) this.autoScrollTop = Infinity; // from here, only the bottom sticks again
      },
      { passive: true },
    );
    // The transcript grew after layout (rendered markdown, text sized once shown): stay at the bottom.
    new ResizeObserver(() => this.stick && this.scrollToBottom()).observe(els.transcript);
    // Scrolling up to the top reads the next older page, as the button does.
    els.scroller.addEventListener('scroll', () => els.scroller.scrollTop < 80 && this.loadEarlier(), { passive: true });
    composer.setDefaultMode(this.project?.running_default);
    composer.setCommands(this.session.commands || []);
    document.addEventListener('hermesweb:session-renamed', (event) => {
      this.session.title = event.detail.title;
      this.renderTitle();
    });
    // Archived or restored from the sidebar or the composer.
    document.addEventListener('hermesweb:session-updated', (event) => {
      if (event.detail.id !== this.sessionId) return;
      this.session.status = event.detail.status;
      this.refresh();
    });
  }

  // ---------------------------------------------------------------- start-up

  async start() {
    this.status.setConnection('connecting');
    this.renderTitle();
    try {
      await this.loadTranscript({ withFragments: true, initial: true });
      this.revealFromHash();
    } catch (error) {
      this.showLoadError(error);
    }
    window.addEventListener('hashchange', () => this.revealFromHash());
    this.socket = new SessionSocket({
      sessionId: this.sessionId,
      cursors: () => this.cursors(),
      onEvent: (event) => this.onEvent(event),
      onSession: (session) => this.onSession(session),
      onError: (code, message) => this.onSocketError(code, message),
      onState: (state, info) => this.onConnection(state, info),
      onReconnectTick: () => this.poll(),
      onFatal: (reason) => this.onFatal(reason),
    });
    this.socket.start();
    for (const entry of outbox.list(this.sessionId)) {
      this.showOutgoing(entry, 'sending');
      this.post(entry);
    }
    this.els.root.dataset.ready = 'true';
  }

  showLoadError(error) {
    this.els.transcript.append(
      h('div', { class: 'turn-banner banner-failed', role: 'alert' }, h('strong', { text: 'Could not load the transcript.' }), h('span', { class: 'reason', text: error.message })),
    );
  }

  cursors() {
    const after = {};
    for (const view of this.turns.values()) if (!view.terminal) after[view.runId] = view.lastSeq;
    return after;
  }

  // Merge the server's transcript: new turns are added, turns the server has
  // further along catch up from the journal, turns we are ahead on are kept.
  // Only a first read or a reload returns turns we hold; a merge asks for newer ones.
  async loadTranscript({ replace = false, withFragments = false, initial = false } = {}) {
    // A merge asks only for turns newer than ours (issue 25: a long turn's first page came twice):
    // the turns we hold catch up through the socket's cursors, or `poll` without one.
    const newest = initial || replace || !this.turns.size ? null : Math.max(...this.turns.keys());
    const transcript = await api.transcript(this.sessionId, null, newest);
    // Asked for once the transcript is here: the server answers a page's requests one at a time
    // (Django's sync views share one thread), and the page waits only on the transcript.
    const fragmentsRead = withFragments ? fetchFragments(this.sessionId, null).catch(() => new Map()) : null;
    // More turns than a page began while we were away: the newest page does not reach ours, start over from it.
    const gap = transcript.has_more && this.turns.size > 0 && !transcript.turns.some((turn) => this.turns.has(turn.run_id));
    if (initial || replace || gap) this.setEarlier(transcript);
    if (replace || gap) {
      for (const view of this.turns.values()) view.el.remove();
      this.turns.clear();
    }
    for (const turn of transcript.turns) {
      const view = this.turns.get(turn.run_id);
      if (!view) this.addTurn(turn);
      else if ((turn.state?.last_seq ?? 0) > view.lastSeq) {
        // Catch up event by event rather than redraw: keeps what the user opened or typed.
        this.repair(view);
      }
    }
    this.session.title = transcript.title;
    this.session.status = transcript.status;
    this.session.active_run_id = transcript.active_run_id;
    this.intents.setIntents(transcript.intents);
    for (const view of this.turns.values()) this.drainBuffered(view);
    this.refresh();
    this.scrollToBottom(initial || replace);
    // The turns are usable as drawn (plain text until their markdown comes): the rendered
    // fragments are laid over them when they arrive, without holding up the page (issue 25).
    if (fragmentsRead) fragmentsRead.then((fragments) => this.onFragments(fragments, initial || replace));
    else this.requestFragments();
  }

  onFragments(fragments, scroll) {
    const stick = scroll && this.stick;
    this.applyFragments(fragments);
    this.requestFragments();
    if (stick) this.scrollToBottom();
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

  // ---------------------------------------------------------------- earlier turns

  buildEarlier() {
    this.earlierButton = h('button', { type: 'button', class: 'btn', text: 'Load earlier turns', onclick: () => this.loadEarlier() });
    this.earlierNote = h('span', { class: 'load-earlier-note', role: 'status' });
    return h('div', { class: 'load-earlier', hidden: true }, this.earlierButton, this.earlierNote);
  }

  setEarlier(page) {
    this.earlier.hasMore = Boolean(page.has_more);
    this.earlier.before = page.before ?? null;
    this.renderEarlier();
  }

  renderEarlier() {
    const { hasMore, loading, failed } = this.earlier;
    // The note stays once the last page came, so a screen reader hears how many turns arrived.
    this.earlierButton.hidden = !hasMore;
    this.earlierEl.hidden = !hasMore && !this.earlierNote.textContent;
    // Busy, not disabled: a keyboard user's focus stays on it while the page comes.
    this.earlierButton.setAttribute('aria-busy', loading ? 'true' : 'false');
    this.earlierButton.textContent = loading ? 'Loading earlier turns…' : failed ? 'Try again: load earlier turns' : 'Load earlier turns';
  }

  // The next older page of turns, put above the first one without moving what the reader sees.
  loadEarlier() {
    if (this.earlier.loading) return this.earlier.loading;
    if (!this.earlier.hasMore) return Promise.resolve();
    const before = this.earlier.before;
    const hadFocus = this.earlierEl.contains(document.activeElement);
    this.earlier.loading = (async () => {
      try {
        const [page, fragments] = await Promise.all([
          api.transcript(this.sessionId, before),
          fetchFragments(this.sessionId, null, before).catch(() => new Map()),
        ]);
        const scroller = this.els.scroller;
        const fromBottom = scroller.scrollHeight - scroller.scrollTop;
        const added = page.turns.filter((turn) => !this.turns.has(turn.run_id)).map((turn) => this.addTurn(turn));
        this.applyFragments(fragments);
        for (const view of added) this.drainBuffered(view);
        this.earlier.failed = false;
        this.setEarlier(page);
        scroller.scrollTop = scroller.scrollHeight - fromBottom;
        this.earlierNote.textContent = `${added.length} earlier ${added.length === 1 ? 'turn' : 'turns'} loaded.`;
        // The button went away with the last page: keep keyboard focus in the transcript.
        if (hadFocus && !page.has_more && added.length) added[added.length - 1].el.focus({ preventScroll: true });
        this.requestFragments();
        this.refresh();
      } catch (error) {
        this.earlier.failed = true;
        this.earlierNote.textContent = 'Could not load earlier turns.';
        if (!(error instanceof NetworkError)) console.warn('earlier turns failed', error);
      } finally {
        this.earlier.loading = null;
        this.renderEarlier();
      }
    })();
    this.renderEarlier();
    return this.earlier.loading;
  }

  addTurn(turn) {
    const view = new TurnView(turn, this.handlers);
    this.turns.set(turn.run_id, view);
    const later = [...this.turns.values()].filter((v) => v.runId > turn.run_id).sort((a, b) => a.runId - b.runId)[0];
    if (later) later.el.before(view.el);
    else this.els.transcript.append(view.el);
    if (turn.client_id) {
      // The server has this message as a turn: it is acknowledged whatever happened to the POST's answer.
      this.removeOutgoing(turn.client_id);
      outbox.remove(turn.client_id);
    }
    if (view.terminal) this.needsFragment.add(view.runId);
    else view.el.dataset.rendered = 'false';
    this.els.empty.hidden = true;
    return view;
  }

  resync() {
    if (this.resyncing) {
      this.resyncAgain = true;
      return this.resyncing;
    }
    this.resyncing = (async () => {
      try {
        do {
          this.resyncAgain = false;
          await this.loadTranscript();
        } while (this.resyncAgain);
      } catch (error) {
        if (!(error instanceof NetworkError)) console.warn('transcript reload failed', error);
      } finally {
        this.resyncing = null;
      }
    })();
    return this.resyncing;
  }

  async reload() {
    await this.loadTranscript({ replace: true, withFragments: true });
    this.socket.resubscribe();
  }

  // ---------------------------------------------------------------- events

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
    this.dirty.add(view);
    this.scheduleFlush();
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
        this.agentTitle = event.payload?.title || this.agentTitle;
        this.renderTitle();
        break;
      default:
        break;
    }
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
    this.refresh();
    this.scrollToBottom();
    if (this.dirty.size) this.scheduleFlush();
  }

  // A turn catching up on a replay is drawn later (TurnView.holdFor); its events are applied meanwhile.
  holdFlush(view, wait) {
    if (this.held.has(view)) return;
    this.held.add(view);
    setTimeout(() => {
      this.held.delete(view);
      this.dirty.add(view);
      this.scheduleFlush();
    }, wait);
  }

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
    this.scrollToBottom();
  }

  onFatal(reason) {
    if (reason === 'unauthenticated') {
      toLogin();
      return;
    }
    this.composer.setDisabled('This session no longer exists.');
    this.status.setConnection('offline');
  }

  // The server's snapshot: {session_id, status, active_run_id, active_run_status, title, commands, intents, running_default, …}.
  onSession(session) {
    if (session.session_id !== undefined && Number(session.session_id) !== this.sessionId) return;
    const { session_id: _ignored, ...fields } = session;
    Object.assign(this.session, fields);
    if (session.running_default && session.running_default !== this.project?.running_default) {
      if (this.project) this.project.running_default = session.running_default;
      this.composer.setDefaultMode(session.running_default);
    }
    if (Array.isArray(session.intents)) this.intents.setIntents(session.intents);
    if (Array.isArray(session.commands)) this.composer.setCommands(session.commands);
    const active = session.active_run_id;
    if (active && !this.turns.has(active)) this.resync();
    this.renderTitle();
    this.refresh();
  }

  onSocketError(code, message) {
    if (code === 'cursor_expired' || code === 'cursor_ahead') {
      this.reload();
      return;
    }
    this.composer.setNote(message ? `Live updates: ${message}` : `Live updates: ${code}`);
  }

  onConnection(state, info) {
    this.status.setConnection(state, info);
    document.body.dataset.connection = state;
    if (state === 'live') {
      // A run that started and ended while we were away (or between the transcript
      // read and the subscribe) is in no cursor and no longer active: only the transcript has it.
      this.resync();
      this.composer.setNote('');
      for (const entry of outbox.list(this.sessionId)) if (entry.failed) this.post(entry);
    }
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

  // ---------------------------------------------------------------- derived state

  activeView() {
    let active = null;
    for (const view of this.turns.values()) if (!view.terminal && (!active || view.runId > active.runId)) active = view;
    return active;
  }

  lastUsage() {
    const views = [...this.turns.values()].sort((a, b) => b.runId - a.runId);
    for (const view of views) {
      const usage = view.state.usage?.size ? view.state.usage : view.state.usage_final?.context;
      if (usage?.size) return usage;
    }
    return null;
  }

  refresh() {
    const active = this.activeView();
    this.status.setRun(active ? active.status : null);
    this.status.setUsage(this.lastUsage());
    this.composer.setActive(!!active, { canStop: !!active && active.status !== 'cancelling' });
    // Read-only while the session or its project is archived: the composer says which, with Restore.
    const lock = composerLock({ project: this.project, session: { ...this.session, id: this.sessionId } });
    if ((lock?.kind ?? null) !== this.lockKind) {
      this.lockKind = lock?.kind ?? null;
      this.composer.setLocked(lock);
    }
    this.intents.setActiveRun(active && active.status !== 'queued' ? active.runId : null);
    this.renderAttention();
    this.els.root.dataset.runStatus = active ? active.status : 'idle';
    this.els.empty.hidden = this.turns.size > 0 || this.els.outgoing.childElementCount > 0;
  }

  // What waits for the user (an open approval or question) comes first: a bar above the
  // queue and the composer that brings it into view, whatever the reader is looking at.
  waiting() {
    for (const view of this.orderedViews()) {
      if (view.terminal) continue;
      const item = view.state.items.find((i) => (i.kind === 'approval' || i.kind === 'clarify') && !i.resolved);
      if (item) return { view, item };
    }
    return null;
  }

  renderAttention() {
    const bar = this.els.attention;
    if (!bar) return;
    const waiting = this.waiting();
    bar.hidden = !waiting;
    if (!waiting) return;
    const { view, item } = waiting;
    const what = item.kind === 'approval' ? `Approval needed: ${item.title || 'permission requested'}` : `Question: ${item.question || 'the agent asks'}`;
    const button = bar.querySelector('button');
    if (button.textContent !== what) button.textContent = what;
    button.onclick = () => {
      const node = view.nodes.get(item);
      if (!node) return;
      node.scrollIntoView({ block: 'center' });
      this.stick = this.atBottom();
      node.querySelector('button:not(:disabled), input, textarea, select')?.focus({ preventScroll: true });
    };
  }

  titleText() {
    let fromRun = null;
    for (const view of this.turns.values()) if (view.state.title) fromRun = view.state.title;
    // The sidebar's name for an untitled session, so the header and the list agree.
    return this.session.title || this.agentTitle || fromRun || sessionTitle({ id: this.sessionId });
  }

  renderTitle() {
    const title = this.titleText();
    this.els.title.textContent = title;
    document.title = `${title} · hermesweb`;
    this.sidebar.updateSession({ ...this.session, id: this.sessionId, title: this.session.title || this.agentTitle || '' });
  }

  atBottom() {
    const el = this.els.scroller;
    return el.scrollHeight - el.scrollTop - el.clientHeight < 24;
  }

  // Keep the reader's place unless they are at the bottom (or `force`: they just sent something).
  scrollToBottom(force = false) {
    if (!force && !this.stick) return;
    this.stick = true;
    this.els.scroller.scrollTop = this.els.scroller.scrollHeight;
    this.autoScrollTop = this.els.scroller.scrollTop;
  }

  // ---------------------------------------------------------------- turn navigation

  orderedViews() {
    return [...this.turns.values()].sort((a, b) => a.runId - b.runId);
  }

  // The previous (-1) or next (+1) turn; it is scrolled to and focused. From the turn jumped to
  // last while it is still in view, else from the reading position: at the bottom, past the
  // last turn; otherwise the turn at the top of the view (k from its middle goes to its start).
  jump(direction) {
    const views = this.orderedViews();
    if (!views.length) return false;
    const box = this.els.scroller.getBoundingClientRect();
    const rects = views.map((view) => view.el.getBoundingClientRect());
    const visible = (rect) => rect.bottom > box.top + 4 && rect.top < box.bottom - 4;
    let index = views.indexOf(this.currentTurn);
    let target = null;
    if (index !== -1 && visible(rects[index])) {
      target = views[index + direction];
    } else if (this.atBottom() && direction < 0) {
      target = views[views.length - 1];
    } else {
      index = rects.findIndex((rect) => rect.bottom > box.top + 4);
      if (index === -1) index = views.length - 1;
      if (direction < 0) target = rects[index].top < box.top - 4 ? views[index] : views[index - 1];
      else target = views[index + 1];
    }
    if (!target) return false;
    this.currentTurn = target;
    target.el.scrollIntoView({ block: 'start' });
    target.el.focus({ preventScroll: true });
    this.stick = this.atBottom();
    return true;
  }

  // A search hit (`#run-<id>`, search.js): its turn scrolled to the top of the view, focused and
  // marked; the reader's place from then on, so the stream does not pull the view away.
  revealRun(runId) {
    const view = this.turns.get(Number(runId));
    if (!view) {
      // An older turn than the pages read so far: read back to it, a page at a time.
      if (!this.earlier.hasMore || Number(runId) >= this.earlier.before) return false;
      this.loadEarlier().then(() => !this.earlier.failed && this.revealRun(runId));
      return true;
    }
    for (const el of this.els.transcript.querySelectorAll('.turn.revealed')) el.classList.remove('revealed');
    view.el.classList.add('revealed');
    this.currentTurn = view;
    view.el.scrollIntoView({ block: 'start' });
    view.el.focus({ preventScroll: true });
    this.stick = this.atBottom();
    return true;
  }

  revealFromHash() {
    const match = /^#run-(\d+)$/.exec(location.hash);
    return match ? this.revealRun(Number(match[1])) : false;
  }

  // Send a turn's prompt (and attachments) again, as a new turn (a new client_id: not a duplicate).
  retry(view) {
    const text = view.turn.prompt_text || '';
    if (!text.trim()) return;
    this.send(text, this.activeView() ? 'queue' : 'auto', view.turn.attachments || []);
  }

  // The open approval (the oldest still waiting), for the key map's digits.
  openApproval() {
    for (const view of this.orderedViews()) {
      const card = view.el.querySelector(".approval-card[data-state='pending']");
      if (card) return card;
    }
    return null;
  }

  // ---------------------------------------------------------------- sending

  async send(text, mode, attachments = []) {
    askPermissionOnce();
    const entry = { client_id: uuid(), session_id: this.sessionId, text, mode, attachments, created_at: Date.now() };
    outbox.add(entry);
    this.showOutgoing(entry, 'sending');
    this.scrollToBottom(true);
    await this.post(entry);
  }

  async post(entry) {
    this.showOutgoing(entry, 'sending');
    try {
      const body = { client_id: entry.client_id, text: entry.text, mode: entry.mode };
      if (entry.attachments?.length) body.attachments = entry.attachments.map((a) => a.id);
      // Over the socket when it is open; over HTTP when it is not, or could not tell.
      const result = (await this.socket.submit(body)) ?? (await api.submitMessage(this.sessionId, body));
      outbox.remove(entry.client_id);
      this.acknowledge(entry, result);
    } catch (error) {
      if (error instanceof NetworkError || (error instanceof ApiError && (error.status >= 500 || error.status === 401))) {
        // Same client_id on retry: the server dedupes, so a retry never makes a second turn.
        // Signed out: kept, and sent again once the page is live after signing in.
        outbox.update(entry.client_id, { failed: true });
        const why = error.status === 401 ? 'signed out; it is sent once you sign in again' : 'the server could not be reached';
        this.showOutgoing(entry, 'failed', `Not sent: ${why}.`);
      } else {
        outbox.remove(entry.client_id);
        this.showOutgoing(entry, 'refused', error.message);
        // Archived since the page loaded (another tab): the composer says so from now on.
        if (error.code === 'session_archived') this.session.status = 'archived';
        if (error.code === 'project_archived' && this.project) this.project.status = 'archived';
        this.refresh();
      }
    }
  }

  acknowledge(entry, result) {
    this.removeOutgoing(entry.client_id);
    if (result.run_id && !this.turns.has(result.run_id)) {
      if (result.kind === 'run') {
        const view = this.addTurn({
          run_id: result.run_id,
          client_id: entry.client_id,
          prompt_text: entry.text,
          attachments: entry.attachments || [],
          source: 'composer',
          source_meta: {},
          status: result.status,
          state: emptyState(),
        });
        this.drainBuffered(view);
        this.dirty.add(view);
        this.scheduleFlush();
      } else {
        this.resync();
      }
    }
    if (result.kind !== 'run') {
      api.intents(this.sessionId).then((list) => this.intents.setIntents(list), () => {});
      if (result.kind === 'queue' && entry.mode === 'steer') {
        this.composer.setNote('Could not steer right now, so the message was queued (see the reason on its card).');
      }
    }
    this.refresh();
  }

  showOutgoing(entry, state, message = '') {
    let node = this.els.outgoing.querySelector(`[data-client-id="${CSS.escape(entry.client_id)}"]`);
    const actions = [];
    if (state === 'failed') {
      actions.push(h('button', { type: 'button', class: 'btn small', text: 'Retry', onclick: () => this.post(entry) }));
      actions.push(h('button', { type: 'button', class: 'btn small', text: 'Discard', onclick: () => (outbox.remove(entry.client_id), this.removeOutgoing(entry.client_id)) }));
    } else if (state === 'refused') {
      actions.push(h('button', { type: 'button', class: 'btn small', text: 'Edit', onclick: () => (this.removeOutgoing(entry.client_id), this.composer.restore(entry.text, entry.attachments)) }));
      actions.push(h('button', { type: 'button', class: 'btn small', text: 'Dismiss', onclick: () => this.removeOutgoing(entry.client_id) }));
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
    else this.els.outgoing.append(fresh);
    this.els.empty.hidden = true;
  }

  removeOutgoing(clientId) {
    this.els.outgoing.querySelector(`[data-client-id="${CSS.escape(clientId)}"]`)?.remove();
  }

  // ---------------------------------------------------------------- controls

  async stop() {
    const active = this.activeView();
    if (!active) return;
    try {
      const result = await api.cancel(active.runId);
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
      else if (action === 'steer') result = await api.steerIntent(intent.id, this.activeView()?.runId);
      else if (action === 'stop-and-send') result = await api.stopAndSend(intent.id, this.activeView()?.runId);
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
