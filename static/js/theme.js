// Light, dark, or the system's: a toggle that cycles, kept in localStorage
// (theme-init.js applies it before the first paint), in step across tabs.

const KEY = 'hermesweb.theme';
const ORDER = ['system', 'light', 'dark'];
const LABELS = { system: 'System', light: 'Light', dark: 'Dark' };
const GLYPHS = { system: '◐', light: '☀', dark: '☾' };

export function currentTheme() {
  try {
    const value = localStorage.getItem(KEY);
    return ORDER.includes(value) ? value : 'system';
  } catch {
    return 'system';
  }
}

function apply(theme) {
  if (theme === 'system') delete document.documentElement.dataset.theme;
  else document.documentElement.dataset.theme = theme;
}

export function setTheme(theme) {
  try {
    if (theme === 'system') localStorage.removeItem(KEY);
    else localStorage.setItem(KEY, theme);
  } catch {
    // Not kept, but still applied to this page.
  }
  apply(theme);
}

// `button`: cycles System → Light → Dark; its name says the current theme.
export function themeToggle(button) {
  const render = () => {
    const theme = currentTheme();
    const next = ORDER[(ORDER.indexOf(theme) + 1) % ORDER.length];
    button.textContent = GLYPHS[theme];
    button.setAttribute('aria-label', `Theme: ${LABELS[theme]}`);
    button.title = `Theme: ${LABELS[theme]} (switch to ${LABELS[next].toLowerCase()})`;
    button.dataset.theme = theme;
  };
  button.addEventListener('click', () => {
    setTheme(ORDER[(ORDER.indexOf(currentTheme()) + 1) % ORDER.length]);
    render();
  });
  window.addEventListener('storage', (event) => {
    if (event.key !== KEY && event.key !== null) return;
    apply(currentTheme());
    render();
  });
  render();
}
