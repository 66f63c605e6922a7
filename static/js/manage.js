// The sidebar's forms (docs/ui.md, "Managing from the browser"): a new project, a project's
// settings, a workflow (new or edited) and its launch. Each saves through the API; what the
// server answered goes back to the sidebar (`onSaved`), which keeps the lists.

import { api } from './api.js';
import { isArchived } from './archive.js';
import { formDialog } from './dialogs.js';
import { h, uuid } from './dom.js';
import { worktreeLaunchFields } from './worktree.js';

// A form's save: true (the dialog closes) once `action` went through; otherwise false, the
// server's reason in the form's error line.
async function save(error, action) {
  try {
    await action();
    return true;
  } catch (err) {
    error.textContent = err.message;
    return false;
  }
}

export function launchDialog(workflow) {
  const fields = (workflow.variables || []).map((name) =>
    h('label', { class: 'field' }, h('span', { text: name }), h('textarea', { name, rows: 2, required: true })),
  );
  const error = h('div', { class: 'form-error', role: 'alert' });
  const clientId = uuid();
  const worktree = worktreeLaunchFields(); // a new session in its own worktree (worktree.js)
  const dialog = formDialog(`Launch “${workflow.name}”`, [workflow.description ? h('p', { class: 'muted', text: workflow.description }) : null, ...fields, worktree.nodes, error], 'Launch', async (form) => {
    const variables = {};
    for (const name of workflow.variables || []) variables[name] = form.elements.namedItem(name).value;
    return save(error, async () => {
      const result = await api.launchWorkflow(workflow.id, { variables, client_id: clientId, ...worktree.body() });
      const run = await api.run(result.run_id);
      location.assign(`/sessions/${run.session_id}/`);
    });
  });
  dialog.showModal();
}

// The agent field: the operator's agents from GET /api/agents (runs/agent_catalog.py), each
// with whether it can start here; one that cannot is offered only if the project already has
// it. Until the list arrives (or if it cannot be had) it offers `current` and `fallback` names.
// The line under it says where the chosen agent runs and what its last initialize reported.
function agentField(current, fallback = []) {
  const select = h('select', { name: 'agent', required: true, 'data-role': 'agent-picker' });
  const hint = h('p', { class: 'hint muted', 'data-role': 'agent-hint' });
  const byName = new Map();
  const fill = (agents) => {
    byName.clear();
    for (const a of agents) byName.set(a.name, a);
    const chosen = current || agents.find((a) => a.default && a.can_start)?.name || agents.find((a) => a.can_start)?.name || '';
    select.replaceChildren(
      ...agents.map((a) =>
        h('option', {
          value: a.name,
          text: a.can_start ? `${a.label} (${a.name})` : `${a.label} (${a.name}): cannot start here`,
          disabled: !a.can_start && a.name !== current,
        }),
      ),
    );
    if (chosen && !byName.has(chosen)) select.prepend(h('option', { value: chosen, text: `${chosen} (not configured)` }));
    select.value = chosen;
    describe();
  };
  const describe = () => {
    const agent = byName.get(select.value);
    if (!agent) {
      hint.textContent = select.value ? 'Not among the operator\'s agents: it cannot start.' : '';
      return;
    }
    if (!agent.can_start) {
      hint.textContent = `Cannot start here: ${agent.why_not}.`;
      return;
    }
    const caps = agent.capabilities || {};
    const can = [caps.loadSession && 'reopens sessions', caps.promptCapabilities?.image && 'images', caps.sessionCapabilities?.fork && 'fork'].filter(Boolean);
    const where = agent.sandbox === 'bubblewrap' ? 'Runs in the sandbox' : 'Runs unsandboxed';
    hint.textContent = `${where}.${agent.reported_at ? ` Reported: ${can.length ? can.join(', ') : 'no optional capabilities'}.` : ' Not started yet.'}`;
  };
  select.addEventListener('change', describe);
  fill([...new Set([current, ...fallback].filter(Boolean))].map((name) => ({ name, label: name, can_start: true, capabilities: {} })));
  hint.textContent = '';
  api.agents().then(fill, () => {});
  return [h('label', { class: 'field' }, h('span', { text: 'Agent (configured by the operator)' }), select), hint];
}

// `agents`: names to offer until the operator's list arrives; Archive/Restore closes the dialog
// and calls `onToggleArchived`.
export function editProjectDialog(project, { agents, onSaved, onToggleArchived }) {
  const error = h('div', { class: 'form-error', role: 'alert' });
  const dialog = formDialog(
    `Project “${project.name}”`,
    [
      h('label', { class: 'field' }, h('span', { text: 'Name' }), h('input', { name: 'name', required: true, maxlength: '200', value: project.name })),
      ...agentField(project.agent, agents),
      h(
        'label',
        { class: 'field' },
        h('span', { text: 'While the agent is running, new messages' }),
        h(
          'select',
          { name: 'running_default' },
          h('option', { value: 'queue', text: 'Queue by default', selected: project.running_default === 'queue' }),
          h('option', { value: 'steer', text: 'Steer by default', selected: project.running_default === 'steer' }),
        ),
      ),
      labelsField((project.required_labels || []).join(', ')),
      h('p', { class: 'hint muted', text: `Directory: ${project.path}` }),
      error,
      h(
        'div',
        { class: 'dialog-aside' },
        h('p', {
          class: 'hint muted',
          text: isArchived(project)
            ? 'This project is archived: it is listed under Archived projects and its sessions take no new messages.'
            : 'Archiving hides the project from the list; its sessions stay readable and take no new messages until it is restored.',
        }),
        h('button', {
          type: 'button',
          class: 'btn small',
          'data-role': isArchived(project) ? 'restore-project' : 'archive-project',
          text: isArchived(project) ? 'Restore project' : 'Archive project',
          onclick: () => {
            dialog.close();
            onToggleArchived();
          },
        }),
      ),
    ],
    'Save',
    async (form) => {
      const body = {};
      for (const name of ['name', 'agent', 'running_default']) {
        const value = form.elements.namedItem(name).value.trim();
        if (value !== project[name]) body[name] = value;
      }
      const labels = labelList(form);
      if (labels.join(',') !== (project.required_labels || []).join(',')) body.required_labels = labels;
      if (!Object.keys(body).length) return true;
      return save(error, async () => {
        const updated = await api.updateProject(project.id, body);
        onSaved(updated);
        document.dispatchEvent(new CustomEvent('hermesweb:project-updated', { detail: updated }));
      });
    },
  );
  dialog.showModal();
}

// `workflow` null: a new one. The template's {fields} are listed as they are typed;
// the server's answer (`variables`) is what Launch asks for.
export function workflowDialog(project, workflow, { onSaved }) {
  const error = h('div', { class: 'form-error', role: 'alert' });
  const fieldsNote = h('div', { class: 'hint', role: 'status', 'aria-live': 'polite' });
  const template = h('textarea', {
    name: 'prompt_template',
    rows: 6,
    required: true,
    value: workflow?.prompt_template ?? '',
    'aria-describedby': `template-fields-${project.id}`,
    oninput: () => showFields(),
  });
  fieldsNote.id = `template-fields-${project.id}`;
  template.id = `template-${project.id}`;
  const showFields = () => {
    const parsed = templateFields(template.value);
    fieldsNote.textContent = parsed.error
      ? parsed.error
      : parsed.fields.length
        ? `Fields asked at launch: ${parsed.fields.join(', ')}`
        : 'No fields: {name} in the text becomes a field; {{ and }} are literal braces.';
    fieldsNote.classList.toggle('form-error', !!parsed.error);
  };
  showFields();
  const dialog = formDialog(
    workflow ? `Workflow “${workflow.name}”` : `New workflow in ${project.name}`,
    [
      h('label', { class: 'field' }, h('span', { text: 'Name' }), h('input', { name: 'name', required: true, maxlength: '200', value: workflow?.name ?? '' })),
      h('label', { class: 'field' }, h('span', { text: 'Description' }), h('input', { name: 'description', value: workflow?.description ?? '' })),
      h('div', { class: 'field' }, h('label', { for: `template-${project.id}`, text: 'Prompt template' }), template, fieldsNote),
      h(
        'div',
        { class: 'field-row' },
        h('label', { class: 'field' }, h('span', { text: 'Mode (optional)' }), h('input', { name: 'agent_mode', maxlength: '100', value: workflow?.agent_mode ?? '' })),
        h('label', { class: 'field' }, h('span', { text: 'Model (optional)' }), h('input', { name: 'agent_model', maxlength: '200', value: workflow?.agent_model ?? '' })),
      ),
      error,
    ],
    workflow ? 'Save' : 'Create',
    async (form) => {
      const body = {};
      for (const name of ['name', 'description', 'prompt_template', 'agent_mode', 'agent_model']) {
        body[name] = form.elements.namedItem(name).value;
      }
      body.name = body.name.trim();
      return save(error, async () => {
        const saved = workflow ? await api.updateWorkflow(workflow.id, body) : await api.createWorkflow(project.id, body);
        onSaved(saved);
      });
    },
  );
  dialog.classList.add('wide');
  dialog.showModal();
}

// Runner labels the project's turns need (docs/runner.md, "Placement"): "host=build-1, gpu".
function labelsField(value) {
  return h(
    'label',
    { class: 'field' },
    h('span', { text: 'Runs only on runners with labels (optional)' }),
    h('input', { name: 'required_labels', value, placeholder: 'host=build-1, gpu', maxlength: '2000' }),
  );
}

function labelList(form) {
  const raw = form.elements.namedItem('required_labels').value;
  return [...new Set(raw.split(',').map((label) => label.trim()).filter(Boolean))].sort();
}

export function newProjectDialog() {
  const error = h('div', { class: 'form-error', role: 'alert' });
  const dialog = formDialog(
    'New project',
    [
      h('label', { class: 'field' }, h('span', { text: 'Name' }), h('input', { name: 'name', required: true, maxlength: '200' })),
      h('label', { class: 'field' }, h('span', { text: 'Directory (absolute path inside an allowed root)' }), h('input', { name: 'path', required: true })),
      ...agentField(''),
      h(
        'label',
        { class: 'field' },
        h('span', { text: 'While the agent is running, new messages' }),
        h('select', { name: 'running_default' }, h('option', { value: 'queue', text: 'Queue by default' }), h('option', { value: 'steer', text: 'Steer by default' })),
      ),
      labelsField(''),
      error,
    ],
    'Create',
    async (form) => {
      const body = {
        name: form.elements.namedItem('name').value,
        path: form.elements.namedItem('path').value,
        ...(form.elements.namedItem('agent').value ? { agent: form.elements.namedItem('agent').value } : {}),
        running_default: form.elements.namedItem('running_default').value,
        required_labels: labelList(form),
      };
      return save(error, async () => {
        const project = await api.createProject(body);
        location.assign(`/projects/${project.id}/`);
      });
    },
  );
  dialog.showModal();
}

// The {fields} of a prompt template, as Python's string.Formatter reads them (the server's
// Workflow.variables): {{ and }} are literal braces; a field name ends at ! or :.
export function templateFields(text) {
  const fields = [];
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    if (c === '{' && text[i + 1] === '{') i += 2;
    else if (c === '}' && text[i + 1] === '}') i += 2;
    else if (c === '}') return { fields, error: 'A single } must be written }}.' };
    else if (c === '{') {
      const end = text.indexOf('}', i + 1);
      if (end === -1) return { fields, error: 'A { is not closed (write {{ for a literal brace).' };
      const name = text.slice(i + 1, end).split(/[!:]/)[0];
      if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name)) return { fields, error: `{${name}}: a field is a plain name (letters, digits, _).` };
      if (!fields.includes(name)) fields.push(name);
      i = end + 1;
    } else i++;
  }
  return { fields, error: null };
}
