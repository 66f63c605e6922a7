// The tab shows how many sessions wait on the user (an approval or a question): "(2) title"
// and a badge on the favicon. The icon is an SVG data URL: the page's CSP allows `img-src data:`.

const PREFIX = /^\(\d+\) /;
let waiting = 0;

function icon(count) {
  const badge = count
    ? `<circle cx="23" cy="9" r="9" fill="#d9480f"/><text x="23" y="13" font-size="${count > 9 ? 10 : 13}" text-anchor="middle" fill="#fff" font-family="sans-serif" font-weight="700">${count > 9 ? '9+' : count}</text>`
    : '';
  const svg = `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32"><rect x="1" y="5" width="26" height="26" rx="6" fill="#3b5bdb"/><text x="14" y="25" font-size="19" text-anchor="middle" fill="#fff" font-family="sans-serif" font-weight="700">h</text>${badge}</svg>`;
  return `data:image/svg+xml,${encodeURIComponent(svg)}`;
}

function applyTitle() {
  const base = document.title.replace(PREFIX, '');
  const wanted = waiting ? `(${waiting}) ${base}` : base;
  if (document.title !== wanted) document.title = wanted;
}

export function showWaiting(count) {
  if (count === waiting && document.querySelector('link[rel=icon][data-count]')) return;
  waiting = count;
  let link = document.querySelector('link[rel=icon]');
  if (!link) {
    link = document.createElement('link');
    link.rel = 'icon';
    document.head.append(link);
  }
  link.href = icon(count);
  link.dataset.count = String(count);
  applyTitle();
}

// Other modules set the title (a session renamed, a project edited): the count stays in front.
const titleElement = document.querySelector('title');
if (titleElement) new MutationObserver(applyTitle).observe(titleElement, { childList: true, characterData: true, subtree: true });
