// A long session's older turns (docs/ui.md, "Long sessions"): the transcript comes a page at a
// time, newest first; "Load earlier turns" above the first one (or scrolling up to the top)
// reads the next older page and puts it above without moving what the reader sees.

import { api, fetchFragments, NetworkError } from './api.js';
import { h } from './dom.js';

export class EarlierTurns {
  // `addPage(page, fragments)` puts a page's turns we do not hold yet in the transcript and
  // returns their views; `onLoaded()` follows, once the page is placed and the view kept still.
  constructor({ sessionId, scroller, addPage, onLoaded }) {
    this.sessionId = sessionId;
    this.scroller = scroller;
    this.addPage = addPage;
    this.onLoaded = onLoaded;
    // `before` is the cursor of the next older page, `loading` the request under way.
    this.before = null;
    this.hasMore = false;
    this.loading = null;
    this.failed = false;
    this.button = h('button', { type: 'button', class: 'btn', text: 'Load earlier turns', onclick: () => this.load() });
    this.note = h('span', { class: 'load-earlier-note', role: 'status' });
    this.el = h('div', { class: 'load-earlier', hidden: true }, this.button, this.note);
    // Scrolling up to the top reads the next older page, as the button does.
    scroller.addEventListener('scroll', () => scroller.scrollTop < 80 && this.load(), { passive: true });
  }

  // A transcript page's cursor (`before`, `has_more`): what is left to read above it.
  set(page) {
    this.hasMore = Boolean(page.has_more);
    this.before = page.before ?? null;
    this.render();
  }

  render() {
    const { hasMore, loading, failed } = this;
    // The note stays once the last page came, so a screen reader hears how many turns arrived.
    this.button.hidden = !hasMore;
    this.el.hidden = !hasMore && !this.note.textContent;
    // Busy, not disabled: a keyboard user's focus stays on it while the page comes.
    this.button.setAttribute('aria-busy', loading ? 'true' : 'false');
    this.button.textContent = loading ? 'Loading earlier turns…' : failed ? 'Try again: load earlier turns' : 'Load earlier turns';
  }

  // The next older page of turns, put above the first one without moving what the reader sees.
  load() {
    if (this.loading) return this.loading;
    if (!this.hasMore) return Promise.resolve();
    const before = this.before;
    const hadFocus = this.el.contains(document.activeElement);
    this.loading = (async () => {
      try {
        const [page, fragments] = await Promise.all([
          api.transcript(this.sessionId, before),
          fetchFragments(this.sessionId, null, before).catch(() => new Map()),
        ]);
        const scroller = this.scroller;
        const fromBottom = scroller.scrollHeight - scroller.scrollTop;
        const added = this.addPage(page, fragments);
        this.failed = false;
        this.set(page);
        scroller.scrollTop = scroller.scrollHeight - fromBottom;
        this.note.textContent = `${added.length} earlier ${added.length === 1 ? 'turn' : 'turns'} loaded.`;
        // The button went away with the last page: keep keyboard focus in the transcript.
        if (hadFocus && !page.has_more && added.length) added[added.length - 1].el.focus({ preventScroll: true });
        this.onLoaded();
      } catch (error) {
        this.failed = true;
        this.note.textContent = 'Could not load earlier turns.';
        if (!(error instanceof NetworkError)) console.warn('earlier turns failed', error);
      } finally {
        this.loading = null;
        this.render();
      }
    })();
    this.render();
    return this.loading;
  }
}
