// Browser notifications while the tab is hidden: a run finished, or it waits for the user.

// Events older than this are a replay (a reconnect, a reload), not news.
const FRESH_SECONDS = 60;

export function askPermissionOnce() {
  // Browsers only show the prompt for a user gesture; this is called from Send.
  if (!('Notification' in window) || Notification.permission !== 'default') return;
  if (sessionStorage.getItem('hermesweb.notify.asked')) return;
  sessionStorage.setItem('hermesweb.notify.asked', '1');
  try {
    Notification.requestPermission().catch(() => {});
  } catch {
    // Old Safari: callback form only; not worth supporting.
  }
}

export function notifyIfHidden(event, title) {
  if (!document.hidden || !('Notification' in window) || Notification.permission !== 'granted') return;
  if (Date.now() / 1000 - (event.created_at || 0) > FRESH_SECONDS) return;
  const payload = event.payload || {};
  let body = null;
  if (event.type === 'done') {
    body = { completed: 'The run finished.', cancelled: 'The run was cancelled.', failed: 'The run failed.', interrupted: 'The run was interrupted.' }[payload.state];
  } else if (event.type === 'approval.requested') {
    body = `Approval needed: ${payload.title || 'permission requested'}`;
  } else if (event.type === 'clarify.requested') {
    body = `Question: ${payload.question || ''}`;
  }
  if (!body) return;
  try {
    const note = new Notification(title || 'hermesweb', { body, tag: `hermesweb-${event.run_id}-${event.type}` });
    note.onclick = () => {
      window.focus();
      note.close();
    };
  } catch {
    // Some platforms only allow notifications from a service worker.
  }
}
