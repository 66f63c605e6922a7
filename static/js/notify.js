// Browser notifications for the user's sessions: a run finished, or a session waits for the
// user (an approval, a question). Fed by the user channel's `sessions` frames (every tab gets
// them), so it covers every session, not only the open one.
//
// - Once per event: the key is the run (`done:<run>`) or the request (`wait:<run>:<seq>`),
//   remembered in localStorage, so a reconnect's or a reload's snapshot does not notify again.
// - One tab notifies: the one holding the Web Lock `hermesweb-notifier` (the next tab takes it
//   when that one closes). Only that tab writes the keys, so there is no race between tabs.
//   Without Web Locks (an insecure origin) every tab notifies, still once per event per tab.
// - Not for a session some tab shows and is visible: tabs tell each other over a BroadcastChannel.
// - A setting turns it off (localStorage, the 🔔 switch in the sidebar).

const SETTING = 'hermesweb.notify';
const SEEN = 'hermesweb.notify.seen';
const SEEN_MAX = 200;
const AWAITING = new Set(['awaiting_approval', 'awaiting_clarify']);
const ENDED = { completed: 'finished', failed: 'failed', cancelled: 'was cancelled', interrupted: 'was interrupted' };

export function notificationsOn() {
  return localStorage.getItem(SETTING) !== 'off';
}

function setNotificationsOn(on) {
  localStorage.setItem(SETTING, on ? 'on' : 'off');
}

export function askPermissionOnce() {
  // Browsers only show the prompt for a user gesture; this is called from Send.
  if (!notificationsOn() || !('Notification' in window) || Notification.permission !== 'default') return;
  if (sessionStorage.getItem('hermesweb.notify.asked')) return;
  sessionStorage.setItem('hermesweb.notify.asked', '1');
  requestPermission();
}

function requestPermission() {
  try {
    Notification.requestPermission()?.catch?.(() => {});
  } catch {
    // Old Safari: callback form only; not worth supporting.
  }
}

// The switch in the sidebar's foot: on by default, persisted.
export function notifyToggle(button) {
  const show = () => {
    const on = notificationsOn();
    button.setAttribute('aria-checked', String(on));
    button.title = on ? 'On: a background session finished or needs you' : 'Off';
  };
  button.addEventListener('click', () => {
    setNotificationsOn(!notificationsOn());
    if (notificationsOn() && 'Notification' in window && Notification.permission === 'default') requestPermission();
    show();
  });
  window.addEventListener('storage', (event) => event.key === SETTING && show());
  show();
}

function seenKeys() {
  try {
    return JSON.parse(localStorage.getItem(SEEN) || '[]');
  } catch {
    return [];
  }
}

export class Notifier {
  constructor({ currentSessionId }) {
    this.current = currentSessionId;
    this.tab = `${Date.now()}-${Math.random()}`;
    this.shown = new Map(); // tab → the session it shows while visible
    this.leader = !navigator.locks;
    navigator.locks?.request('hermesweb-notifier', () => {
      this.leader = true;
      return new Promise(() => {}); // held until this tab closes
    });
    this.channel = 'BroadcastChannel' in window ? new BroadcastChannel('hermesweb-tabs') : null;
    this.channel?.addEventListener('message', ({ data }) => {
      if (data.ask) this.announce();
      else if (data.session == null) this.shown.delete(data.tab);
      else this.shown.set(data.tab, data.session);
    });
    document.addEventListener('visibilitychange', () => this.announce());
    window.addEventListener('pagehide', () => this.channel?.postMessage({ tab: this.tab, session: null }));
    this.announce();
    this.channel?.postMessage({ ask: true });
  }

  visibleSession() {
    return document.hidden ? null : this.current;
  }

  announce() {
    this.channel?.postMessage({ tab: this.tab, session: this.visibleSession() });
  }

  shownSomewhere(sessionId) {
    return this.visibleSession() === sessionId || [...this.shown.values()].includes(sessionId);
  }

  // `changed`: the frame's states; `prev`: the states before it. A page's first frame is the
  // baseline: what was already so when it loaded is not news.
  changed(prev, changed, first) {
    if (first || !this.leader || !notificationsOn()) return;
    if (!('Notification' in window) || Notification.permission !== 'granted') return;
    for (const state of changed) {
      const note = this.news(prev.get(state.id), state);
      if (note && !this.shownSomewhere(state.id)) this.show(note, state);
    }
  }

  news(before, state) {
    if (AWAITING.has(state.run_status) && state.waiting_seq) {
      const what = state.run_status === 'awaiting_approval' ? 'Approval needed.' : 'A question for you.';
      return { key: `wait:${state.run_id}:${state.waiting_seq}`, body: what };
    }
    const ended = before?.run_id && state.run_id !== before.run_id && state.last_run_id === before.run_id;
    if (ended && ENDED[state.last_run_status]) {
      return { key: `done:${before.run_id}`, body: `The run ${ENDED[state.last_run_status]}.` };
    }
    return null;
  }

  show({ key, body }, state) {
    const seen = seenKeys();
    if (seen.includes(key)) return;
    localStorage.setItem(SEEN, JSON.stringify([...seen, key].slice(-SEEN_MAX)));
    const title = state.title || `Untitled session ${state.id}`;
    try {
      const note = new Notification(title, { body, tag: `hermesweb-${key}` });
      note.onclick = () => {
        window.focus();
        location.assign(`/sessions/${state.id}/`);
        note.close();
      };
    } catch {
      // Some platforms only allow notifications from a service worker.
    }
  }
}
