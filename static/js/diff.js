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

export function renderDiff(block) {
  const lines = lineDiff(block.old_text ?? '', block.new_text ?? '');
  const added = lines.filter((l) => l.op === '+').length;
  const removed = lines.filter((l) => l.op === '-').length;
  const isNew = block.old_text === null || block.old_text === undefined;
  return h(
    'div',
    { class: 'diff' },
    h(
      'div',
      { class: 'diff-head' },
      h('span', { class: 'diff-path', text: block.path || '(unnamed file)' }),
      isNew ? h('span', { class: 'badge', text: 'new file' }) : null,
      h('span', { class: 'diff-stat' }, h('span', { class: 'add', text: `+${added}` }), ' ', h('span', { class: 'del', text: `-${removed}` })),
    ),
    h(
      'pre',
      { class: 'diff-body' },
      lines.map((line) =>
        h('span', { class: line.op === '+' ? 'line add' : line.op === '-' ? 'line del' : 'line ctx' }, `${line.op} ${line.text}\n`),
      ),
    ),
  );
}
