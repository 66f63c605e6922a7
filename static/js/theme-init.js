// Runs before the first paint (a classic script in <head>): the theme the user chose,
// so a dark page never flashes light. No choice: the system's (prefers-color-scheme).
try {
  const theme = localStorage.getItem('hermesweb.theme');
  if (theme === 'light' || theme === 'dark') document.documentElement.dataset.theme = theme;
} catch {
  // Storage refused (private mode, a policy): the system's theme.
}
