// Why a queued turn has not started (runs/capacity.py): the words the sidebar and the header
// show. `waiting` is {reason, running, position, labels, path}; null when it is about to start.

export function waitingText(waiting) {
  if (!waiting) return '';
  if (waiting.reason === 'waiting_for_slot') {
    const running = `${waiting.running} of your turns ${waiting.running === 1 ? 'is' : 'are'} running`;
    const ahead = waiting.position > 1 ? ` (${waiting.position - 1} ahead)` : '';
    return `waiting: ${running}${ahead}`;
  }
  if (waiting.reason === 'waiting_for_runner') {
    const labels = waiting.labels?.length ? ` with ${waiting.labels.join(', ')}` : '';
    return `waiting for a runner${labels}`;
  }
  return 'waiting';
}

// The sidebar's short badge: the header and the badge's title carry the whole sentence.
export function waitingBadge(waiting) {
  return waiting?.reason === 'waiting_for_runner' ? 'no runner' : 'waiting';
}
