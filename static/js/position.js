// Where the reader is in the open session's transcript. The stream is followed only while
// they are at the bottom: a reader who scrolled up stays put. Previous/next turn (k/j, the
// header's arrows) and a search hit (`#run-<id>`) move the view to a turn and focus it.

export class ReadingPosition {
  constructor(scroller, transcript) {
    this.scroller = scroller;
    this.transcript = transcript;
    this.stick = true;
    this.autoScrollTop = 0; // where scrollToBottom last put the view
    this.currentTurn = null; // the turn jumped to last
    // Only the reader moving up unsticks: text laid out below the view (its size known only once
    // shown: .md.plain's content-visibility, chunks) moves the bottom away without anyone scrolling.
    scroller.addEventListener('scroll', () => this.followReader(), { passive: true });
    // The transcript grew after layout (rendered markdown, text sized once shown): stay at the bottom,
    // unless the reader moved up since and the scroll event telling us has not come yet.
    new ResizeObserver(() => this.followReader() && this.scrollToBottom()).observe(transcript);
  }

  // Whether the stream is still followed: the view is at the bottom, or where it last was there
  // (text grew below it since).
  followReader() {
    const top = this.scroller.scrollTop;
    if (this.atBottom()) this.autoScrollTop = top;
    this.stick = top >= this.autoScrollTop - 2;
    if (!this.stick) this.autoScrollTop = Infinity; // from here, only the bottom sticks again
    return this.stick;
  }

  atBottom() {
    const el = this.scroller;
    return el.scrollHeight - el.scrollTop - el.clientHeight < 24;
  }

  // Keep the reader's place unless they are at the bottom (or `force`: they just sent something).
  scrollToBottom(force = false) {
    if (!force && !this.stick) return;
    this.stick = true;
    this.scroller.scrollTop = this.scroller.scrollHeight;
    this.autoScrollTop = this.scroller.scrollTop;
  }

  // The view was moved for the reader (to a turn, to what waits for them): the stream is followed
  // again only if that left them at the bottom.
  moved() {
    this.autoScrollTop = Infinity;
    this.followReader();
  }

  // The previous (-1) or next (+1) of `views` (in order); it is scrolled to and focused. From the
  // turn jumped to last while it is still in view, else from the reading position: at the bottom,
  // past the last turn; otherwise the turn at the top of the view (k from its middle goes to its start).
  jump(views, direction) {
    if (!views.length) return false;
    const box = this.scroller.getBoundingClientRect();
    const rects = views.map((view) => view.el.getBoundingClientRect());
    const visible = (rect) => rect.bottom > box.top + 4 && rect.top < box.bottom - 4;
    let index = views.indexOf(this.currentTurn);
    let target = null;
    if (index !== -1 && visible(rects[index])) {
      target = views[index + direction];
    } else if (this.atBottom() && direction < 0) {
      target = views[views.length - 1];
    } else {
      index = rects.findIndex((rect) => rect.bottom > box.top + 4);
      if (index === -1) index = views.length - 1;
      if (direction < 0) target = rects[index].top < box.top - 4 ? views[index] : views[index - 1];
      else target = views[index + 1];
    }
    if (!target) return false;
    this.currentTurn = target;
    target.el.scrollIntoView({ block: 'start' });
    target.el.focus({ preventScroll: true });
    this.moved();
    return true;
  }

  // A search hit's turn: scrolled to the top of the view, focused and marked; the reader's place
  // from then on, so the stream does not pull the view away.
  reveal(view) {
    for (const el of this.transcript.querySelectorAll('.turn.revealed')) el.classList.remove('revealed');
    view.el.classList.add('revealed');
    this.currentTurn = view;
    view.el.scrollIntoView({ block: 'start' });
    view.el.focus({ preventScroll: true });
    this.moved();
  }
}
