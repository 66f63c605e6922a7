// The session socket (issue 4's protocol) with reconnect and resume.
//
// On every (re)connect it subscribes with the cursors the app hands it
// (`{run_id: last_seq}`), so the server replays only what the page lacks; the
// app drops anything at or below its cursor anyway. Heartbeats carry no
// cursor: they only prove the connection is alive.

import { ApiError } from './api.js';

const BACKOFF_MS = [500, 1000, 2000, 4000, 8000];
const BACKOFF_MAX_MS = 10000;
const PING_MS = 15000;
// Silence this long means a dead connection even if TCP has not noticed.
const WATCHDOG_MS = 45000;
// After this many failed attempts in a row the status line says "offline".
const OFFLINE_AFTER = 4;
// The server's application close codes (runs/live/consumer.py).
const CLOSE_UNAUTHENTICATED = 4401;
const CLOSE_NOT_FOUND = 4404;
// 4008, "too slow" (the client did not read what was sent), is retried as any other close is:
// with backoff, resuming from the cursors.
// The server reads frames up to 64 KiB (runs/live/protocol.py); a longer message goes over HTTP.
const SUBMIT_MAX_CHARS = 60000;
// A submit not answered by then is sent again over HTTP (the same client_id: the same message).
const SUBMIT_ANSWER_MS = 8000;

export class SessionSocket {
  constructor({ sessionId, cursors, onEvent, onSession, onError, onState, onReconnectTick, onFatal }) {
    this.sessionId = sessionId;
    this.cursors = cursors;
    this.onEvent = onEvent;
    this.onSession = onSession;
    this.onError = onError;
    this.onState = onState;
    this.onReconnectTick = onReconnectTick || (() => {});
    this.onFatal = onFatal || (() => {});
    this.ws = null;
    this.failures = 0;
    this.stopped = false;
    this.state = 'connecting';
    this.timer = null;
    this.pingTimer = null;
    this.lastMessageAt = 0;
    this.nextAttemptAt = 0;
    this.submits = new Map(); // client_id → settle(result | ApiError | null)
    window.addEventListener('online', () => this.reconnectNow());
    window.addEventListener('offline', () => {
      // The network is gone, so this socket is too, whatever TCP says yet (an open socket can
      // outlive it for minutes): close it and retry with backoff; online, it resumes from the cursors.
      if (this.ws) this.ws.close(4002, 'offline');
      this.setState('offline');
    });
    document.addEventListener('visibilitychange', () => {
      if (!document.hidden && this.state !== 'live') this.reconnectNow();
    });
  }

  url() {
    const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
    // No session open (a project, the home page): the user's sessions' states only.
    const path = this.sessionId == null ? '/ws/live/' : `/ws/sessions/${this.sessionId}/`;
    return `${scheme}://${location.host}${path}`;
  }

  setState(state) {
    if (this.state === state) return;
    this.state = state;
    this.onState(state, { failures: this.failures, nextAttemptAt: this.nextAttemptAt });
  }

  start() {
    this.stopped = false;
    this.connect();
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    clearInterval(this.pingTimer);
    if (this.ws) this.ws.close(1000, 'page closed');
  }

  // Subscribe again on a fresh connection, e.g. after the app reloaded the transcript.
  resubscribe() {
    if (this.ws) this.ws.close(4000, 'resubscribe');
    else this.reconnectNow();
  }

  reconnectNow() {
    if (this.stopped) return;
    clearTimeout(this.timer);
    if (this.ws && (this.ws.readyState === WebSocket.OPEN || this.ws.readyState === WebSocket.CONNECTING)) return;
    this.connect();
  }

  connect() {
    clearTimeout(this.timer);
    let ws;
    try {
      ws = new WebSocket(this.url());
    } catch {
      this.scheduleReconnect();
      return;
    }
    this.ws = ws;
    let opened = false;
    ws.onopen = () => {
      opened = true;
      this.lastMessageAt = Date.now();
      if (this.sessionId != null) this.send({ type: 'subscribe', after: this.cursors() });
      // Every tab follows all the user's sessions' live states (the sidebar, the title, notifications).
      this.send({ type: 'sessions' });
      clearInterval(this.pingTimer);
      this.pingTimer = setInterval(() => this.keepAlive(), PING_MS);
    };
    ws.onmessage = (message) => {
      this.lastMessageAt = Date.now();
      if (this.failures || this.state !== 'live') {
        // Only an answer proves the subscription works; an open that is closed at once does not.
        this.failures = 0;
        this.setState('live');
      }
      let data;
      try {
        data = JSON.parse(message.data);
      } catch {
        return;
      }
      if (data.type === 'event' && data.event) this.onEvent(data.event);
      else if (data.type === 'events' && Array.isArray(data.events)) data.events.forEach((e) => this.onEvent(e));
      else if (data.type === 'session' && data.session) this.onSession(data.session);
      else if (data.type === 'submitted') this.submits.get(data.client_id)?.(data);
      else if (data.type === 'sessions') document.dispatchEvent(new CustomEvent('hermesweb:sessions', { detail: data }));
      else if (data.type === 'error') this.onError(data.code, data.message, data);
    };
    ws.onclose = (event) => {
      clearInterval(this.pingTimer);
      if (this.ws !== ws) return;
      // Answers that will not come now: each goes again over HTTP.
      for (const settle of [...this.submits.values()]) settle(null);
      this.ws = null;
      if (this.stopped) return;
      if (event.code === 4000) {
        this.connect();
        return;
      }
      if (event.code === CLOSE_UNAUTHENTICATED || event.code === CLOSE_NOT_FOUND) {
        // Retrying cannot help: signed out, or the session was deleted.
        this.stopped = true;
        this.setState('offline');
        this.onFatal(event.code === CLOSE_UNAUTHENTICATED ? 'unauthenticated' : 'not_found');
        return;
      }
      if (!opened || this.state !== 'live') this.failures += 1;
      else this.failures = 1;
      this.scheduleReconnect(event);
    };
    ws.onerror = () => {
      // onclose follows and does the work.
    };
  }

  keepAlive() {
    if (Date.now() - this.lastMessageAt > WATCHDOG_MS && this.ws) {
      this.ws.close(4001, 'silent');
      return;
    }
    this.send({ type: 'ping' });
  }

  send(message) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(message));
  }

  // Send a message over this socket: the POST's rules and answers without an HTTP request,
  // the shortest way to the first token. Resolves with the POST's result, rejects with an
  // ApiError when refused, and resolves null when it cannot tell (not connected, too long,
  // closed or silent before the answer): the caller then POSTs the same client_id.
  submit(body) {
    const frame = JSON.stringify({ type: 'submit', ...body });
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN || frame.length > SUBMIT_MAX_CHARS) {
      return Promise.resolve(null);
    }
    return new Promise((resolve, reject) => {
      const settle = (data) => {
        if (this.submits.get(body.client_id) !== settle) return;
        this.submits.delete(body.client_id);
        clearTimeout(timer);
        if (data?.error) {
          const { status, code, message, details } = data.error;
          reject(new ApiError(status, code, message, details));
        } else resolve(data ? data.result : null);
      };
      const timer = setTimeout(() => settle(null), SUBMIT_ANSWER_MS);
      this.submits.get(body.client_id)?.(null);
      this.submits.set(body.client_id, settle);
      this.ws.send(frame);
    });
  }

  scheduleReconnect() {
    const base = BACKOFF_MS[Math.min(this.failures - 1, BACKOFF_MS.length - 1)] ?? BACKOFF_MAX_MS;
    // Jitter spreads a restart's reconnect storm over time.
    const delay = Math.min(BACKOFF_MAX_MS, base) * (0.75 + Math.random() * 0.5);
    this.nextAttemptAt = Date.now() + delay;
    const offline = !navigator.onLine || this.failures >= OFFLINE_AFTER;
    this.state = null;
    this.setState(offline ? 'offline' : 'reconnecting');
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.connect(), delay);
    this.onReconnectTick();
  }
}
