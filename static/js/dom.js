// Small DOM helpers. Text always goes in as text nodes: nothing here parses HTML.

export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'class') el.className = value;
    else if (key === 'text') el.textContent = value;
    else if (key === 'dataset') Object.assign(el.dataset, value);
    else if (key.startsWith('on') && typeof value === 'function') el.addEventListener(key.slice(2), value);
    else if (key === 'value' || key === 'checked' || key === 'disabled' || key === 'open' || key === 'hidden') el[key] = value;
    else el.setAttribute(key, value === true ? '' : String(value));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

// What a pointer, or the Space key on a button or summary (which click on their release), is
// pressed on; null when nothing is. One tracker for the page: a view made per turn adds no
// listener of its own, so none outlives it.
let pressed = null;
const afterRelease = new Set();

function release() {
  if (!pressed) return;
  pressed = null;
  if (!afterRelease.size) return;
  // The click that completes this release is dispatched after it, in the same task.
  setTimeout(() => {
    const waiting = [...afterRelease];
    afterRelease.clear();
    for (const run of waiting) run();
  }, 0);
}

window.addEventListener('pointerdown', (event) => (pressed = event.target), true);
window.addEventListener(
  'keydown',
  (event) => {
    if (event.key === ' ' && event.target.closest?.('button, summary')) pressed = event.target;
  },
  true,
);
for (const type of ['pointerup', 'pointercancel', 'keyup']) window.addEventListener(type, release, true);
window.addEventListener('blur', (event) => event.target === window && release());

// A click is a press and a release on one element: a redraw between the two (a frame arriving)
// replaces the element, and the click is lost. `draw`, held while something in `el` is pressed,
// and run once, without arguments, after the release's click.
export function heldWhilePressed(el, draw) {
  let waiting = false;
  const later = () => {
    waiting = false;
    render();
  };
  const render = (...args) => {
    if (pressed && el.contains(pressed)) {
      if (!waiting) afterRelease.add(later);
      waiting = true;
      return;
    }
    draw(...args);
  };
  return render;
}

// Replace `old` by `fresh`, keeping which <details data-key> the user had opened or closed.
export function swap(old, fresh) {
  if (!old) return fresh;
  for (const details of old.querySelectorAll('details[data-key]')) {
    const twin = fresh.querySelector(`details[data-key="${CSS.escape(details.dataset.key)}"]`);
    if (twin) twin.open = details.open;
  }
  if (old.matches('details[data-key]') && fresh.matches('details[data-key]')) fresh.open = old.open;
  old.replaceWith(fresh);
  return fresh;
}

export function uuid() {
  if (globalThis.crypto?.randomUUID) {
    try {
      return crypto.randomUUID();
    } catch {
      // randomUUID exists only in secure contexts; plain http on a LAN address falls through.
    }
  }
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  bytes[6] = (bytes[6] & 0x0f) | 0x40;
  bytes[8] = (bytes[8] & 0x3f) | 0x80;
  const hex = [...bytes].map((b) => b.toString(16).padStart(2, '0')).join('');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

export function pretty(value) {
  if (value === undefined || value === null) return '';
  if (typeof value === 'string') return value;
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

export function formatTokens(n) {
  if (typeof n !== 'number') return '';
  if (n >= 1000) return `${(n / 1000).toFixed(n >= 10000 ? 0 : 1)}k`;
  return String(n);
}

export function humanize(status) {
  return (status || '').replaceAll('_', ' ');
}

// Copy text; the async clipboard needs a secure context, so fall back to a selection.
export async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    try {
      await navigator.clipboard.writeText(text);
      return true;
    } catch {
      // fall through
    }
  }
  const area = h('textarea', { class: 'offscreen', readonly: true, value: text });
  document.body.append(area);
  area.select();
  let ok = false;
  try {
    ok = document.execCommand('copy');
  } catch {
    ok = false;
  }
  area.remove();
  return ok;
}
