// A line diff for edit tool cards: old_text → new_text, rendered as text nodes.

import { h } from './dom.js';

// Past this many lines on both sides the LCS table gets costly; show both versions instead.
const MAX_CELLS = 4_000_000;

export function lineDiff(oldText, newText) {
  const a = oldText ? oldText.split('\n') : [];
  const b = newText ? newText.split('\n') : [];
  if (a.length && a[a.length - 1] === '') a.pop();
  if (b.length && b[b.length - 1] === '') b.pop();
  // Common head and tail first: an edit usually touches a few lines of a long file.
  let start = 0;
  while (start < a.length && start < b.length && a[start] === b[start]) start++;
  let endA = a.length;
  let endB = b.length;
  while (endA > start && endB > start && a[endA - 1] === b[endB - 1]) {
    endA--;
    endB--;
  }
  const midA = a.slice(start, endA);
  const midB = b.slice(start, endB);
  const out = a.slice(0, start).map((text) => ({ op: ' ', text }));
  if (midA.length * midB.length > MAX_CELLS) {
    for (const text of midA) out.push({ op: '-', text });
    for (const text of midB) out.push({ op: '+', text });
  } else {
    const n = midA.length;
    const m = midB.length;
    const lcs = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
    for (let i = n - 1; i >= 0; i--) {
      for (let j = m - 1; j >= 0; j--) {
        lcs[i][j] = midA[i] === midB[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
      }
    }
    let i = 0;
    let j = 0;
    while (i < n && j < m) {
      if (midA[i] === midB[j]) {
        out.push({ op: ' ', text: midA[i] });
        i++;
        j++;
      } else if (lcs[i + 1][j] >= lcs[i][j + 1]) {
        out.push({ op: '-', text: midA[i++] });
      } else {
        out.push({ op: '+', text: midB[j++] });
      }
    }
    while (i < n) out.push({ op: '-', text: midA[i++] });
    while (j < m) out.push({ op: '+', text: midB[j++] });
  }
  for (const text of a.slice(endA)) out.push({ op: ' ', text });
  return out;
}

// Paths under the project's directory are shown relative to it (the whole path in a tooltip).
let root = '';
export function setDiffRoot(path) {
  root = path ? path.replace(/\/+$/, '') + '/' : '';
}

function shownPath(path) {
  return root && path.startsWith(root) && path.length > root.length ? path.slice(root.length) : path;
}

// Unchanged lines kept around each change; longer unchanged runs fold into one row.
export const CONTEXT = 3;

// Number the lines and fold long unchanged runs: rows of {op, text, oldNo, newNo} and
// {fold: key, hidden: rows} (key: the fold's index, for remembering it was opened).
export function diffRows(lines, context = CONTEXT) {
  let oldNo = 0;
  let newNo = 0;
  const numbered = lines.map((line) => {
    if (line.op !== '+') oldNo++;
    if (line.op !== '-') newNo++;
    return { ...line, oldNo: line.op === '+' ? null : oldNo, newNo: line.op === '-' ? null : newNo };
  });
  const changed = numbered.map((line) => line.op !== ' ');
  const near = new Array(numbered.length).fill(false);
  numbered.forEach((_, i) => {
    if (!changed[i]) return;
    for (let j = Math.max(0, i - context); j <= Math.min(numbered.length - 1, i + context); j++) near[j] = true;
  });
  const rows = [];
  let run = [];
  let folds = 0;
  const flushRun = () => {
    // A fold must hide more than the row that stands for it.
    if (run.length > 1) rows.push({ fold: folds++, hidden: run });
    else rows.push(...run);
    run = [];
  };
  numbered.forEach((line, i) => {
    if (near[i] || changed[i]) {
      flushRun();
      rows.push(line);
    } else {
      run.push(line);
    }
  });
  flushRun();
  return rows;
}

export function lineRow(line) {
  const kind = line.op === '+' ? 'add' : line.op === '-' ? 'del' : 'ctx';
  return h(
    'span',
    { class: `line ${kind}` },
    h('span', { class: 'ln ln-old', 'aria-hidden': 'true', text: line.oldNo ?? '' }),
    h('span', { class: 'ln ln-new', 'aria-hidden': 'true', text: line.newNo ?? '' }),
    h('span', { class: 'op', text: line.op === ' ' ? ' ' : line.op }),
    h('span', { class: 'code', text: `${line.text}\n` }),
  );
}

// `folds`: {isOpen(key), toggle(key)} — kept by the caller, so a redrawn card keeps what was opened.
export function renderDiff(block, folds = null) {
  const lines = lineDiff(block.old_text ?? '', block.new_text ?? '');
  const added = lines.filter((l) => l.op === '+').length;
  const removed = lines.filter((l) => l.op === '-').length;
  const isNew = block.old_text === null || block.old_text === undefined;
  const path = block.path || '(unnamed file)';
  const body = h('pre', { class: 'diff-body', tabindex: '0', 'aria-label': `Diff of ${path}` });
  for (const row of diffRows(lines)) {
    if (row.fold === undefined) {
      body.append(lineRow(row));
      continue;
    }
    const key = `${path}#${row.fold}`;
    if (folds?.isOpen(key)) {
      body.append(...row.hidden.map(lineRow));
      continue;
    }
    const first = row.hidden[0];
    const last = row.hidden[row.hidden.length - 1];
    body.append(
      h(
        'span',
        { class: 'line fold' },
        h('button', {
          type: 'button',
          class: 'fold-button',
          'aria-label': `Show ${row.hidden.length} unchanged lines, ${first.newNo} to ${last.newNo}`,
          text: `⋯ ${row.hidden.length} unchanged lines`,
          onclick: (event) => {
            if (folds) folds.toggle(key);
            else event.currentTarget.parentElement.replaceWith(...row.hidden.map(lineRow));
          },
        }),
        '\n',
      ),
    );
  }
  return h(
    'div',
    { class: 'diff' },
    h(
      'div',
      { class: 'diff-head' },
      h('span', { class: 'diff-path', title: path, text: shownPath(path) }),
      isNew ? h('span', { class: 'badge', text: 'new file' }) : null,
      h('span', { class: 'diff-stat' }, h('span', { class: 'add', text: `+${added}` }), ' ', h('span', { class: 'del', text: `-${removed}` })),
    ),
    body,
  );
}
