// The control API (issue 2's contract): JSON in and out, Django session + CSRF.

const SAFE = new Set(['GET', 'HEAD', 'OPTIONS']);

export class ApiError extends Error {
  constructor(status, code, message, details) {
    super(message || code);
    this.status = status;
    this.code = code;
    this.details = details;
  }
}

// The request never reached an answer (server down, network gone): safe to retry.
export class NetworkError extends Error {
  constructor(cause) {
    super('The server could not be reached.');
    this.cause = cause;
  }
}

export function csrfToken() {
  const match = document.cookie.match(/(?:^|;\s*)csrftoken=([^;]+)/);
  if (match) return decodeURIComponent(match[1]);
  return document.querySelector('input[name=csrfmiddlewaretoken]')?.value || '';
}

// A page already on its way elsewhere (Sign out's form) is not sent to the login page by a
// socket the server closes on the way: signing out closes the user's sockets at once.
let leaving = false;
addEventListener('beforeunload', () => {
  leaving = true;
});

export function toLogin() {
  if (leaving) return;
  const next = encodeURIComponent(location.pathname + location.search);
  location.assign(`/login/?next=${next}`);
}

async function request(method, path, body) {
  const headers = { Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (!SAFE.has(method)) headers['X-CSRFToken'] = csrfToken();
  let response;
  try {
    response = await fetch(`/api${path}`, {
      method,
      headers,
      credentials: 'same-origin',
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (error) {
    throw new NetworkError(error);
  }
  if (response.status === 204) return null;
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  if (!response.ok) {
    if (response.status === 401) toLogin();
    if (response.status >= 502 && response.status <= 504) throw new NetworkError(response.statusText);
    throw new ApiError(response.status, data?.code || `http_${response.status}`, data?.message || response.statusText, data?.details);
  }
  return data;
}

const enc = encodeURIComponent;

export const api = {
  projects: ({ includeArchived = false } = {}) => request('GET', `/projects${includeArchived ? '?include_archived=1' : ''}`),
  createProject: (body) => request('POST', '/projects', body),
  agents: () => request('GET', '/agents'),
  updateProject: (id, body) => request('PATCH', `/projects/${id}`, body),
  sessions: (projectId, status) => request('GET', `/projects/${projectId}/sessions${status ? `?status=${status}` : ''}`),
  createSession: (projectId, title = '') => request('POST', `/projects/${projectId}/sessions`, { title }),
  session: (id) => request('GET', `/sessions/${id}`),
  updateSession: (id, body) => request('PATCH', `/sessions/${id}`, body),
  deleteSession: (id) => request('DELETE', `/sessions/${id}`),
  forkSession: (id) => request('POST', `/sessions/${id}/fork`),
  workflows: (projectId) => request('GET', `/projects/${projectId}/workflows`),
  launchWorkflow: (id, body) => request('POST', `/workflows/${id}/launch`, body),
  createWorkflow: (projectId, body) => request('POST', `/projects/${projectId}/workflows`, body),
  updateWorkflow: (id, body) => request('PATCH', `/workflows/${id}`, body),
  deleteWorkflow: (id) => request('DELETE', `/workflows/${id}`),
  // Automations (docs/automations.md): a workflow's triggers and what they fired.
  triggers: (workflowId) => request('GET', `/workflows/${workflowId}/triggers`),
  createTrigger: (workflowId, body) => request('POST', `/workflows/${workflowId}/triggers`, body),
  updateTrigger: (id, body) => request('PATCH', `/triggers/${id}`, body),
  deleteTrigger: (id) => request('DELETE', `/triggers/${id}`),
  firings: (workflowId) => request('GET', `/workflows/${workflowId}/firings`),
  submitMessage: (sessionId, body) => request('POST', `/sessions/${sessionId}/messages`, body),
  // The newest page of turns, or the page before run `before` (`has_more`: older ones exist).
  // `afterRun`: only the turns newer than that run (a page merging what it does not hold yet).
  transcript: (sessionId, before = null, afterRun = null) =>
    request('GET', `/sessions/${sessionId}/transcript${before ? `?before=${before}` : afterRun ? `?after_run=${afterRun}` : ''}`),
  search: (q, page = 1) => request('GET', `/search?q=${enc(q)}&page=${page}`),
  run: (id) => request('GET', `/runs/${id}`),
  runEvents: (id, afterSeq, limit = 500) => request('GET', `/runs/${id}/events?after_seq=${afterSeq}&limit=${limit}`),
  // A finished run's items before index `before`, a bounded page (a turn that came from its end).
  runItems: (id, before) => request('GET', `/runs/${id}/items?before=${before}`),
  cancel: (runId) => request('POST', `/runs/${runId}/cancel`),
  approve: (runId, approvalId, optionId) =>
    request('POST', `/runs/${runId}/approvals/${enc(approvalId)}`, { option_id: optionId }),
  clarify: (runId, clarifyId, answer) => request('POST', `/runs/${runId}/clarifications/${enc(clarifyId)}`, { answer }),
  // The open queue, whole (the answer's `intents`; it is paged only with include_closed).
  intents: (sessionId) => request('GET', `/sessions/${sessionId}/intents`).then((page) => page.intents),
  // One intent with its whole text: lists and the socket's snapshot carry previews (docs/intents.md).
  intent: (id) => request('GET', `/intents/${id}`),
  editIntent: (id, body) => request('PATCH', `/intents/${id}`, body),
  deleteIntent: (id, version) => request('DELETE', `/intents/${id}?version=${version}`),
  // `runId`: the run the user saw running; if another one is active by now the server answers 409.
  steerIntent: (id, runId) => request('POST', `/intents/${id}/steer`, runId ? { run_id: runId } : {}),
  stopAndSend: (id, runId) => request('POST', `/intents/${id}/stop-and-send`, runId ? { run_id: runId } : {}),
  // Session discovery and import: agent jobs a runner carries out (docs/operations.md).
  discover: (projectId) => request('POST', `/projects/${projectId}/discover`),
  importSession: (projectId, agentSessionId) => request('POST', `/projects/${projectId}/import`, { agent_session_id: agentSessionId }),
  job: (id) => request('GET', `/jobs/${id}`),
  // The workspace (docs/workspace.md): a turn's or the session's changes, rewind and restore.
  runChanges: (id) => request('GET', `/runs/${id}/changes`),
  sessionChanges: (id) => request('GET', `/sessions/${id}/changes`),
  changesSummary: (sessionId, runIds) => request('GET', `/sessions/${sessionId}/changes/summary?runs=${runIds.join(',')}`),
  rewind: (runId, body) => request('POST', `/runs/${runId}/rewind`, body),
  restoreCheckpoint: (id, body) => request('POST', `/checkpoints/${id}/restore`, body),
};

// Rendered, sanitized markdown of settled turns (hermesweb/views.py), parsed
// into an inert document: nothing in it runs, and only its `.md` blocks are used.
// `runIds` null: the settled runs of the transcript's page (the newest, or the one before run `before`).
// A run too large to render comes back as an empty section marked `data-too-large`.
export async function fetchFragments(sessionId, runIds, before = null) {
  if (runIds && !runIds.length) return new Map();
  const query = runIds ? `?runs=${runIds.join(',')}` : before ? `?before=${before}` : '';
  let response;
  try {
    response = await fetch(`/sessions/${sessionId}/fragment${query}`, { credentials: 'same-origin' });
  } catch (error) {
    throw new NetworkError(error);
  }
  if (response.redirected && new URL(response.url).pathname.startsWith('/login')) {
    toLogin();
    throw new ApiError(401, 'not_authenticated', 'Signed out.');
  }
  if (!response.ok) throw new ApiError(response.status, `http_${response.status}`, response.statusText);
  const doc = new DOMParser().parseFromString(await response.text(), 'text/html');
  const sections = new Map();
  for (const section of doc.querySelectorAll('section.turn-fragment')) sections.set(Number(section.dataset.run), section);
  return sections;
}
