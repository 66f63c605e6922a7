// Messages sent but not yet acknowledged, kept in sessionStorage.
//
// Each message gets its client_id once, when the user sends it; a retry after
// a network error (or a reload of the tab) posts the same id again and the
// server answers with the first result (`duplicate: true`) instead of a
// second turn.

const KEY = 'hermesweb.outbox.v1';

function load() {
  try {
    const list = JSON.parse(sessionStorage.getItem(KEY) || '[]');
    return Array.isArray(list) ? list : [];
  } catch {
    return [];
  }
}

function save(list) {
  try {
    sessionStorage.setItem(KEY, JSON.stringify(list));
  } catch {
    // Storage full or disabled: the message still goes out, it just cannot survive a reload.
  }
}

export const outbox = {
  list(sessionId) {
    return load().filter((entry) => entry.session_id === sessionId);
  },
  add(entry) {
    const list = load().filter((e) => e.client_id !== entry.client_id);
    list.push(entry);
    save(list);
  },
  update(clientId, patch) {
    save(load().map((entry) => (entry.client_id === clientId ? { ...entry, ...patch } : entry)));
  },
  remove(clientId) {
    save(load().filter((entry) => entry.client_id !== clientId));
  },
};
