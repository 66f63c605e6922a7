// ANSI escapes in a terminal's output, as text segments with classes: SGR colours (the 16
// colours, and the first 16 of the 256) and bold/dim/italic/underline/inverse become classes
// (static/css/app.css, `.ansi-*`); every other escape (cursor moves, OSC titles, …) is stripped.
// Nothing here builds HTML: terminal.js puts each segment in a span as text.

// CSI (ESC [ params final), OSC (ESC ] … BEL or ESC \), and any other two-byte escape.
const ESCAPE = /\x1b\[([0-?]*)[ -/]*([@-~])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[()#%][ -~]|\x1b[@-Z\\-_]?/g;

function emptyStyle() {
  return { fg: null, bg: null, bold: false, dim: false, italic: false, underline: false, inverse: false };
}

// A carriage return without a newline rewrites its line (progress bars): keep what was last written.
function lastWrites(text) {
  return text
    .replace(/\r+\n/g, '\n')
    .split('\n')
    .map((line) => line.slice(line.lastIndexOf('\r') + 1))
    .join('\n');
}

function applySgr(style, params) {
  const codes = params === '' ? [0] : params.split(';').map((p) => (p === '' ? 0 : Number(p)));
  for (let i = 0; i < codes.length; i += 1) {
    const code = codes[i];
    if (code === 0) Object.assign(style, emptyStyle());
    else if (code === 1) style.bold = true;
    else if (code === 2) style.dim = true;
    else if (code === 3) style.italic = true;
    else if (code === 4) style.underline = true;
    else if (code === 7) style.inverse = true;
    else if (code === 22) style.bold = style.dim = false;
    else if (code === 23) style.italic = false;
    else if (code === 24) style.underline = false;
    else if (code === 27) style.inverse = false;
    else if (code >= 30 && code <= 37) style.fg = code - 30;
    else if (code >= 90 && code <= 97) style.fg = code - 90 + 8;
    else if (code === 39) style.fg = null;
    else if (code >= 40 && code <= 47) style.bg = code - 40;
    else if (code >= 100 && code <= 107) style.bg = code - 100 + 8;
    else if (code === 49) style.bg = null;
    else if (code === 38 || code === 48) {
      // 38;5;n (256 colours: the first 16 kept, the rest drawn plain) or 38;2;r;g;b (drawn plain).
      const key = code === 38 ? 'fg' : 'bg';
      if (codes[i + 1] === 5) {
        const n = codes[i + 2];
        style[key] = Number.isInteger(n) && n < 16 ? n : null;
        i += 2;
      } else if (codes[i + 1] === 2) {
        style[key] = null;
        i += 4;
      }
    }
  }
}

function classesOf(style) {
  const out = [];
  if (style.fg !== null) out.push(`ansi-fg-${style.fg}`);
  if (style.bg !== null) out.push(`ansi-bg-${style.bg}`);
  for (const flag of ['bold', 'dim', 'italic', 'underline', 'inverse']) if (style[flag]) out.push(`ansi-${flag}`);
  return out.join(' ');
}

// [{text, cls}] for `raw`, adjacent segments of one style joined; escapes never appear in text.
export function ansiSegments(raw) {
  const text = lastWrites(String(raw ?? ''));
  const style = emptyStyle();
  const segments = [];
  const push = (piece) => {
    if (!piece) return;
    const cls = classesOf(style);
    const last = segments[segments.length - 1];
    if (last && last.cls === cls) last.text += piece;
    else segments.push({ text: piece, cls });
  };
  let at = 0;
  for (const match of text.matchAll(ESCAPE)) {
    push(text.slice(at, match.index));
    at = match.index + match[0].length;
    if (match[2] === 'm') applySgr(style, match[1]);
  }
  push(text.slice(at));
  // Other control characters (BEL, backspace, …) drawn as nothing; tab and newline kept.
  for (const s of segments) s.text = s.text.replace(/[\x00-\x08\x0b-\x1f\x7f]/g, '');
  return segments.filter((s) => s.text);
}
