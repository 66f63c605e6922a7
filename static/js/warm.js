// Warm agents (docs/runner.md, "Warm-up and memory"): opening a session and typing in its
// composer ask a runner to start the session's agent, so the turn does not wait for it to
// start. At most once per session per interval from this page — not once per keystroke — and
// the server and the runner each keep the interval too. A hint: its failure is ignored.

import { csrfToken } from './api.js';

const INTERVAL_MS = 30_000;
const askedAt = new Map();

export function warmSession(sessionId) {
  const now = performance.now();
  const last = askedAt.get(sessionId);
  if (last !== undefined && now - last < INTERVAL_MS) return false;
  askedAt.set(sessionId, now);
  fetch(`/api/sessions/${encodeURIComponent(sessionId)}/warm`, {
    method: 'POST',
    headers: { Accept: 'application/json', 'X-CSRFToken': csrfToken() },
    credentials: 'same-origin',
  }).catch(() => {});
  return true;
}

// The session's page: warm now, and again when the user types after the interval.
export function warmWhileHere(sessionId, textarea) {
  warmSession(sessionId);
  textarea?.addEventListener('input', () => warmSession(sessionId));
}
