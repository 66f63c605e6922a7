// A workflow's automations (docs/automations.md), opened from its row in the sidebar: its
// triggers with their next times in this browser's time zone and an on/off switch, a form that
// adds a schedule or a webhook (whose URL is shown once), "Run now", and the firing history with
// a link to each session. Every change goes through the API; the dialog then reads it again.

import { api } from './api.js';
import { formDialog } from './dialogs.js';
import { h } from './dom.js';
import { launchDialog } from './manage.js';

const OUTCOMES = {
  launched: 'launched',
  skipped_overlap: 'skipped: still running',
  skipped_missed: 'skipped: missed',
  failed: 'failed',
};

function localTime(iso) {
  return iso ? new Date(iso).toLocaleString() : '—';
}

function describe(trigger) {
  if (trigger.kind === 'webhook') return 'Webhook';
  if (trigger.at) return `Once, ${localTime(trigger.at)}`;
  return `Cron ${trigger.cron} (${trigger.timezone || 'UTC'})`;
}

function triggerRow(trigger, refresh, error) {
  const act = async (action) => {
    try {
      await action();
    } catch (err) {
      error.textContent = err.message;
    }
    await refresh();
  };
  return h(
    'li',
    { class: 'trigger', dataset: { triggerId: String(trigger.id) } },
    h(
      'label',
      { class: 'trigger-switch' },
      h('input', {
        type: 'checkbox',
        'data-role': 'trigger-enabled',
        checked: trigger.enabled,
        'aria-label': `${describe(trigger)}: on`,
        onchange: (event) => act(() => api.updateTrigger(trigger.id, { enabled: event.target.checked })),
      }),
      h('span', { class: 'trigger-what', text: describe(trigger) }),
    ),
    h('span', { class: 'muted trigger-next', text: trigger.kind === 'webhook' ? '' : `next: ${localTime(trigger.next_fire_at)}` }),
    h('button', {
      type: 'button',
      class: 'icon',
      'data-role': 'delete-trigger',
      title: 'Delete',
      'aria-label': `Delete ${describe(trigger)}`,
      text: '✕',
      onclick: () => act(() => api.deleteTrigger(trigger.id)),
    }),
  );
}

function firingRow(firing) {
  const outcome = OUTCOMES[firing.outcome] || firing.outcome;
  return h(
    'li',
    { class: `firing firing-${firing.outcome}`, dataset: { firingId: String(firing.id) } },
    h('span', { class: 'firing-when', text: localTime(firing.planned_at) }),
    h('span', { class: 'firing-outcome', text: outcome }),
    firing.session_id ? h('a', { href: `/sessions/${firing.session_id}/`, text: 'session' }) : null,
    firing.reason ? h('span', { class: 'muted firing-reason', text: firing.reason, title: firing.reason }) : null,
  );
}

export function automationsDialog(workflow) {
  const triggers = h('ul', { class: 'triggers', 'aria-label': 'Triggers' });
  const firings = h('ul', { class: 'firings', 'aria-label': 'Firing history' });
  const shown = h('div', { class: 'trigger-url', hidden: true });
  const error = h('div', { class: 'form-error', role: 'alert' });
  const kind = h(
    'select',
    { name: 'kind', 'data-role': 'trigger-kind', onchange: () => showFields() },
    h('option', { value: 'cron', text: 'On a schedule (cron)' }),
    h('option', { value: 'at', text: 'Once' }),
    h('option', { value: 'webhook', text: 'When a webhook is called' }),
  );
  const cron = h('label', { class: 'field' }, h('span', { text: 'Cron (minute hour day month weekday)' }), h('input', { name: 'cron', value: '0 7 * * 1-5', maxlength: '200' }));
  const zone = h('label', { class: 'field' }, h('span', { text: 'Time zone' }), h('input', { name: 'timezone', value: Intl.DateTimeFormat().resolvedOptions().timeZone || 'UTC', maxlength: '64' }));
  const at = h('label', { class: 'field', hidden: true }, h('span', { text: 'At (your time)' }), h('input', { name: 'at', type: 'datetime-local' }));
  function showFields() {
    cron.hidden = kind.value !== 'cron';
    zone.hidden = kind.value !== 'cron';
    at.hidden = kind.value !== 'at';
  }

  async function refresh() {
    try {
      const [listed, history] = await Promise.all([api.triggers(workflow.id), api.firings(workflow.id)]);
      triggers.replaceChildren(...(listed.length ? listed.map((t) => triggerRow(t, refresh, error)) : [h('li', { class: 'muted', text: 'No triggers yet.' })]));
      firings.replaceChildren(...(history.length ? history.map(firingRow) : [h('li', { class: 'muted', text: 'Nothing fired yet.' })]));
    } catch (err) {
      error.textContent = err.message;
    }
  }

  const dialog = formDialog(
    `Automations of “${workflow.name}”`,
    [
      h('div', { class: 'section-head' }, h('div', { class: 'section-label', text: 'Triggers' }), h('button', { type: 'button', class: 'btn small', 'data-role': 'run-now', text: 'Run now', onclick: () => launchDialog(workflow) })),
      triggers,
      shown,
      h('div', { class: 'section-label', text: 'Add a trigger' }),
      h('label', { class: 'field' }, h('span', { text: 'Fires' }), kind),
      cron,
      zone,
      at,
      error,
      h('div', { class: 'section-label', text: 'History' }),
      firings,
    ],
    'Add trigger',
    async (form) => {
      const body =
        kind.value === 'webhook'
          ? { kind: 'webhook' }
          : kind.value === 'at'
            ? { kind: 'schedule', at: form.elements.namedItem('at').value ? new Date(form.elements.namedItem('at').value).toISOString() : null }
            : { kind: 'schedule', cron: form.elements.namedItem('cron').value, timezone: form.elements.namedItem('timezone').value };
      try {
        const created = await api.createTrigger(workflow.id, body);
        if (created.url) {
          // The secret is in this answer only: say so, and let it be copied now.
          shown.replaceChildren(
            h('span', { text: 'Webhook URL (shown once; POST JSON to it):' }),
            h('input', { readonly: true, 'data-role': 'webhook-url', value: created.url, onfocus: (event) => event.target.select() }),
          );
          shown.hidden = false;
        }
      } catch (err) {
        error.textContent = err.message;
      }
      await refresh();
      return false; // stays open: the list shows what was added
    },
  );
  dialog.classList.add('automations');
  showFields();
  refresh();
  dialog.showModal();
  return dialog;
}
