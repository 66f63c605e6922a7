// Entry point: wires the page's parts to the data the server embedded.

import { api } from './api.js';
import { composerLock } from './archive.js';
import { Composer } from './composer.js';
import { alertDialog } from './dialogs.js';
import { setDiffRoot } from './diff.js';
import { uuid } from './dom.js';
import { IntentsPanel } from './intents.js';
import { installKeyMap, showKeyMap } from './keys.js';
import { showWaiting } from './favicon.js';
import { askPermissionOnce, Notifier, notifyToggle } from './notify.js';
import { outbox } from './outbox.js';
import { mentionsIn } from './mentions.js';
import { Pickers } from './pickers.js';
import { ConfigPickers } from './config-options.js';
import { UsageMeter } from './usage-meter.js';
import { SearchPanel } from './search.js';
import { SessionController } from './session.js';
import { Sidebar, waitingCount } from './sidebar.js';
import { SessionSocket } from './socket.js';
import { StatusLine } from './status.js';
import { themeToggle } from './theme.js';

const data = JSON.parse(document.getElementById('workbench-data').textContent);
const root = document.getElementById('workbench');
const $ = (role) => root.querySelector(`[data-role="${role}"]`);
setDiffRoot(data.project?.path);

const sidebar = new Sidebar(document.getElementById('sidebar'), data, {
  currentSessionId: data.session?.id ?? null,
  onDeletedCurrent: () => location.assign(data.project ? `/projects/${data.project.id}/` : '/'),
});

// Every session's live state over the tab's socket (`sessions` frames): the sidebar, the tab's
// title and favicon (how many wait on the user), and notifications for the other sessions.
const notifier = new Notifier({ currentSessionId: data.session?.id ?? null });
notifyToggle(document.querySelector('[data-role=notify-toggle]'));
document.addEventListener('hermesweb:sessions', (event) => {
  const { prev, changed, first } = sidebar.applyStates(event.detail);
  showWaiting(waitingCount(sidebar.states));
  if (data.session) status.setWaiting(sidebar.states.get(data.session.id)?.waiting);
  notifier.changed(prev, changed, first);
});


// Narrow screens: the sidebar is a drawer.
const setNav = (open) => root.classList.toggle('nav-open', open);
$('open-nav').addEventListener('click', () => setNav(true));
$('close-nav').addEventListener('click', () => setNav(false));
$('backdrop').addEventListener('click', () => setNav(false));
themeToggle($('theme'));
$('keys').addEventListener('click', () => showKeyMap());

let controller = null;
// The search box also searches every session's turns; a hit in the open session is shown in place.
new SearchPanel($('search'), $('search-results'), {
  onOpen: (sessionId, runId) => {
    if (!controller || controller.sessionId !== sessionId || !controller.revealRun(runId)) return false;
    setNav(false);
    return true;
  },
});
// A project edited in the sidebar: its Queue-or-Steer default applies from the next message on.
document.addEventListener('hermesweb:project-updated', (event) => {
  const project = event.detail;
  if (!data.project || project.id !== data.project.id) return;
  Object.assign(data.project, project);
  if (controller?.project) Object.assign(controller.project, project);
  composer.setDefaultMode(project.running_default);
  if (!data.session) {
    $('title').textContent = project.name;
    document.title = `${project.name} · hermesweb`;
  }
  // Archived or restored: the composer locks or takes messages again.
  if (controller) controller.refresh();
  else composer.setLocked(composerLock({ project: data.project }));
});
const status = new StatusLine($('status'), { onRetry: () => controller?.socket?.reconnectNow() });
const composer = new Composer($('composer'), {
  onSend: (text, mode, attachments) => (controller ? controller.send(text, mode, attachments) : startSession(text)),
  onStop: () => controller?.stop(),
  maxBytes: data.attachment_max_bytes,
});

if (data.session) {
  const intents = new IntentsPanel($('intents'), { act: (action, intent, extra) => controller.intentAction(action, intent, extra) });
  controller = new SessionController({
    data,
    els: { root, transcript: $('transcript'), outgoing: $('outgoing'), empty: $('empty'), scroller: $('scroller'), title: $('title'), attention: $('attention') },
    status,
    composer,
    intents,
    sidebar,
  });
  window.hermesweb = controller; // for debugging from the console
  composer.enableAttachments(data.session.id);
  // The mode and model pickers follow the session's live snapshot (the agent reports its modes).
  const pickers = new Pickers($('pickers'), data.session);
  const configPickers = new ConfigPickers($('config-pickers'), $('picker-status'), data.session);
  const onSession = controller.onSession.bind(controller);
  controller.onSession = (snapshot) => {
    onSession(snapshot);
    pickers.apply(snapshot);
    configPickers.apply(snapshot);
  };
  // The context meter beside the composer follows the status line's gauge (usage-meter.js).
  const meter = new UsageMeter($('usage-meter'));
  const setUsage = status.setUsage.bind(status);
  status.setUsage = (usage) => {
    setUsage(usage);
    meter.set(usage);
  };
  $('prev-turn').addEventListener('click', () => controller.jump(-1));
  $('next-turn').addEventListener('click', () => controller.jump(1));
  controller.start();
} else if (data.project) {
  // No session yet: the first message creates one, then the session page sends it
  // from the outbox (same client_id, so a double submit is still one turn).
  status.setConnection('idle');
  status.setRun(null);
  composer.setDefaultMode(data.project.running_default);
  composer.setLocked(composerLock({ project: data.project }));
  composer.deferAttachments();
  root.dataset.ready = 'true';
} else {
  status.setConnection('idle');
  composer.setDisabled('Create a project first (sidebar → New project).');
  root.dataset.ready = 'true';
}

// No session open: the tab's socket follows only the user's sessions' states (/ws/live/); the
// status line shows that socket's state, which is what keeps the sidebar live on this page.
if (!data.session) {
  const states = new SessionSocket({
    sessionId: null,
    onState: (state, info) => status.setConnection(state, info),
    onError: () => {},
  });
  status.onRetry = () => states.reconnectNow();
  states.start();
}

installKeyMap({
  closeNav: () => {
    if (!root.classList.contains('nav-open')) return false;
    setNav(false);
    return true;
  },
  composerIdle: (target) => composer.idle(target),
  canStop: () => !!controller?.activeView(),
  stop: () => controller?.stop(),
  answer: (n) => {
    const button = controller?.openApproval()?.querySelectorAll('.approval-options button')[n - 1];
    if (!button || button.disabled) return false;
    button.click();
    return true;
  },
  focusComposer: () => composer.focus(),
  jump: (direction) => controller?.jump(direction) ?? false,
});

// The first message's session once created: sending again after a failed upload reuses it (one
// the server still refuses, say an image this agent does not take, or the network failed).
let started = null;

async function startSession(text) {
  askPermissionOnce();
  composer.setDisabled('Starting a session…');
  let creating = false;
  try {
    // A file the server would refuse for its type stops the message before any session exists.
    await composer.checkAttachments();
    creating = !started;
    started ??= await api.createSession(data.project.id);
    creating = false;
    // Files attached on this page go up to the new session first: the message names them.
    const attachments = [...(await composer.uploadAttachments(started.id)), ...mentionsIn(text)];
    outbox.add({ client_id: uuid(), session_id: started.id, text, mode: 'auto', attachments, created_at: Date.now() });
    location.assign(`/sessions/${started.id}/`);
  } catch (error) {
    // Deleted meanwhile (from another tab): the next send starts a new session.
    if (error.code === 'not_found') started = null;
    composer.setDisabled(null);
    composer.restore(text);
    alertDialog(creating ? `Could not start a session: ${error.message}` : `Could not attach a file: ${error.message}`);
  }
}
