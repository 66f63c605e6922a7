// An ACP terminal in its tool card: what the command printed, live, its ANSI colours drawn
// (ansi.js), scrolled to its end as each delta redraws it.

import { h } from './dom.js';
import { ansiSegments } from './ansi.js';

// The most drawn of one terminal: its end, as a terminal shows (the journal keeps up to 256 KiB).
const SHOWN_CHARS = 64 * 1024;

export function renderTerminal(terminalId, output) {
  let text = output || '';
  const cut = text.length > SHOWN_CHARS;
  if (cut) text = text.slice(text.length - SHOWN_CHARS);
  const screen = h(
    'pre',
    { class: 'terminal-screen', 'aria-label': 'Terminal output', dataset: { terminalId: terminalId || '' } },
    ansiSegments(text).map((s) => (s.cls ? h('span', { class: s.cls, text: s.text }) : s.text)),
  );
  if (!text) screen.append(h('span', { class: 'terminal-waiting', text: 'waiting for output…' }));
  const box = h('div', { class: 'tool-terminal' }, cut ? h('div', { class: 'terminal-cut', text: '… earlier output not shown' }) : null, screen);
  // Drawn anew on each delta: start at the end, as a terminal does.
  requestAnimationFrame(() => {
    screen.scrollTop = screen.scrollHeight;
  });
  return box;
}
