// The open session: transcript, live events, composer, pending intents. The controller holds the
// session and its turns and wires the parts: the live events' gate and drawing (feed.js), where
// the reader is (position.js), older pages (earlier.js), messages on their way (outgoing.js), and
// the controls (controls.js).
//
// Loading order (docs/ui.md, "Live updates"): the transcript from the API
// first, then the socket subscribes with `{run_id: last_seq}` of every run
// still going, so a reload mid-run shows exactly what an uninterrupted page
// shows.

import { api, fetchFragments, NetworkError, toLogin } from './api.js';
import { composerLock } from './archive.js';
import { RunControls } from './controls.js';
import { h } from './dom.js';
import { EarlierTurns } from './earlier.js';
import { TurnFeed } from './feed.js';
import { askPermissionOnce } from './notify.js';
import { Outgoing } from './outgoing.js';
import { ReadingPosition } from './position.js';
import { emptyState } from './runstate.js';
import { sessionTitle } from './sidebar.js';
import { SessionSocket } from './socket.js';
import { TurnView } from './transcript.js';
import { warmWhileHere } from './warm.js';

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
    this.resyncing = null;
    this.resyncAgain = false;
    this.agentTitle = null;
    this.lockKind = null;
    this.feed = new TurnFeed({
      sessionId: this.sessionId,
      turns: this.turns,
      resync: () => this.resync(),
      reload: () => this.reload(),
      onTitle: (title) => {
        this.agentTitle = title || this.agentTitle;
        this.renderTitle();
      },
      onDrawn: () => {
        this.refresh();
        this.position.scrollToBottom();
      },
      onRendered: () => this.position.scrollToBottom(),
    });
    this.position = new ReadingPosition(els.scroller, els.transcript);
    this.earlier = new EarlierTurns({
      sessionId: this.sessionId,
      scroller: els.scroller,
      addPage: (page, fragments) => {
        const added = page.turns.filter((turn) => !this.turns.has(turn.run_id)).map((turn) => this.addTurn(turn));
        this.feed.applyFragments(fragments);
        for (const view of added) this.feed.drainBuffered(view);
        return added;
      },
      onLoaded: () => {
        this.feed.requestFragments();
        this.refresh();
      },
    });
    els.transcript.prepend(this.earlier.el);
    this.outgoing = new Outgoing(els.outgoing, {
      sessionId: this.sessionId,
      empty: els.empty,
      composer,
      submit: (body) => this.socket.submit(body),
      onAccepted: (entry, result) => this.acknowledge(entry, result),
      onRefused: (error) => {
        // Archived since the page loaded (another tab): the composer says so from now on.
        if (error.code === 'session_archived') this.session.status = 'archived';
        if (error.code === 'project_archived' && this.project) this.project.status = 'archived';
        this.refresh();
      },
    });
    this.controls = new RunControls({ sessionId: this.sessionId, composer, intents, activeRunId: () => this.activeView()?.runId });
    this.handlers = {
      approve: (view, item, option) => this.controls.approve(view, item, option),
      clarify: (view, item, answer) => this.controls.clarify(view, item, answer),
      retry: (view) => this.retry(view),
      edit: (view) => this.composer.restore(view.turn.prompt_text || '', view.turn.attachments || []),
    };

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
    warmWhileHere(this.sessionId, this.composer.textarea); // the agent started while the page loads
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
      cursors: () => this.feed.cursors(),
      onEvent: (event) => this.feed.onEvent(event),
      onSession: (session) => this.onSession(session),
      onError: (code, message) => this.onSocketError(code, message),
      onState: (state, info) => this.onConnection(state, info),
      onReconnectTick: () => this.feed.poll(),
      onFatal: (reason) => this.onFatal(reason),
    });
    this.socket.start();
    this.outgoing.resume();
    this.els.root.dataset.ready = 'true';
  }

  showLoadError(error) {
    this.els.transcript.append(
      h('div', { class: 'turn-banner banner-failed', role: 'alert' }, h('strong', { text: 'Could not load the transcript.' }), h('span', { class: 'reason', text: error.message })),
    );
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
    if (initial || replace || gap) this.earlier.set(transcript);
    if (replace || gap) {
      for (const view of this.turns.values()) view.el.remove();
      this.turns.clear();
    }
    for (const turn of transcript.turns) {
      const view = this.turns.get(turn.run_id);
      if (!view) this.addTurn(turn);
      else if ((turn.state?.last_seq ?? 0) > view.lastSeq) {
        // Catch up event by event rather than redraw: keeps what the user opened or typed.
        this.feed.repair(view);
      }
    }
    this.session.title = transcript.title;
    this.session.status = transcript.status;
    this.session.active_run_id = transcript.active_run_id;
    this.intents.setIntents(transcript.intents);
    for (const view of this.turns.values()) this.feed.drainBuffered(view);
    this.refresh();
    this.position.scrollToBottom(initial || replace);
    // The turns are usable as drawn (plain text until their markdown comes): the rendered
    // fragments are laid over them when they arrive, without holding up the page (issue 25).
    if (fragmentsRead) fragmentsRead.then((fragments) => this.onFragments(fragments, initial || replace));
    else this.feed.requestFragments();
  }

  onFragments(fragments, scroll) {
    const stick = scroll && this.position.stick;
    this.feed.applyFragments(fragments);
    this.feed.requestFragments();
    if (stick) this.position.scrollToBottom();
  }

  addTurn(turn) {
    const view = new TurnView(turn, this.handlers);
    this.turns.set(turn.run_id, view);
    const later = [...this.turns.values()].filter((v) => v.runId > turn.run_id).sort((a, b) => a.runId - b.runId)[0];
    if (later) later.el.before(view.el);
    else this.els.transcript.append(view.el);
    if (turn.client_id) this.outgoing.acknowledged(turn.client_id);
    this.feed.watch(view);
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

  // ---------------------------------------------------------------- socket

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
      this.outgoing.retryFailed();
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
      this.position.moved();
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

  // ---------------------------------------------------------------- turn navigation

  orderedViews() {
    return [...this.turns.values()].sort((a, b) => a.runId - b.runId);
  }

  // The previous (-1) or next (+1) turn, scrolled to and focused (position.js).
  jump(direction) {
    return this.position.jump(this.orderedViews(), direction);
  }

  // A search hit (`#run-<id>`, search.js): its turn scrolled to the top of the view, focused and
  // marked; the reader's place from then on, so the stream does not pull the view away.
  revealRun(runId) {
    const view = this.turns.get(Number(runId));
    if (!view) {
      // An older turn than the pages read so far: read back to it, a page at a time.
      if (!this.earlier.hasMore || Number(runId) >= this.earlier.before) return false;
      this.earlier.load().then(() => !this.earlier.failed && this.revealRun(runId));
      return true;
    }
    this.position.reveal(view);
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

  // ---------------------------------------------------------------- sending and controls

  async send(text, mode, attachments = []) {
    askPermissionOnce();
    const entry = this.outgoing.add(text, mode, attachments);
    this.position.scrollToBottom(true);
    await this.outgoing.post(entry);
  }

  // The server took the message: a run (drawn from here on) or an intent (the queue re-read).
  acknowledge(entry, result) {
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
        this.feed.drainBuffered(view);
        this.feed.draw(view);
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

  stop() {
    return this.controls.stop();
  }

  intentAction(action, intent, extra) {
    return this.controls.intentAction(action, intent, extra);
  }
}
