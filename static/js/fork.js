// Fork (docs/agents.md, "Fork"): a new session that starts with this one's conversation. The
// server copies the settled turns; the agent forks its own session on the new one's first turn.
// Not idempotent on the server, so the button stays disabled while its request is out.

import { api } from './api.js';
import { alertDialog } from './dialogs.js';

export function installFork(button, sessionId) {
  button.hidden = false;
  button.addEventListener('click', async () => {
    if (button.disabled) return;
    button.disabled = true;
    button.setAttribute('aria-busy', 'true');
    try {
      const fork = await api.forkSession(sessionId);
      location.assign(`/sessions/${fork.id}/`);
    } catch (error) {
      button.disabled = false;
      button.removeAttribute('aria-busy');
      alertDialog(`Could not fork this session: ${error.message}`);
    }
  });
}

const button = document.querySelector('[data-role="fork"]');
const data = JSON.parse(document.getElementById('workbench-data')?.textContent || 'null');
if (button && data?.session) installFork(button, data.session.id);
