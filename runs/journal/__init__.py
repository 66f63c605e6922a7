"""The journal: append-only, per-run `seq`, exactly one terminal event.

Design note: docs/journal.md. Appends move `run.last_seq` first (one UPDATE …
RETURNING, which row-locks the run on PostgreSQL; SQLite's IMMEDIATE transactions
serialise writers), insert the batch with the seqs it reserved, all in one
transaction, so seq has neither gaps nor duplicates whoever appends. Events are
published to the channel layer only after the transaction commits.

This package's face: `events` (vocabulary), `append` (writing), `read` (cursors and
pages), `rows` (the SQL both sides share).
"""

from runs.journal.append import (
    GroupResult,
    aappend_group_unpublished,
    append_batch,
    append_group_unpublished,
    append_unpublished,
    as_written,
    written_after,
)
from runs.journal.events import (
    TERMINAL_STATES,
    AlreadyTerminal,
    Appended,
    CursorAhead,
    CursorExpired,
    JournalError,
    NewEvent,
    done_event,
)
from runs.journal.read import (
    EncodedArray,
    EncodedPage,
    check_cursor,
    envelopes,
    read_after,
    read_encoded,
    read_encoded_array,
)

__all__ = [
    "TERMINAL_STATES",
    "AlreadyTerminal",
    "Appended",
    "CursorAhead",
    "CursorExpired",
    "EncodedArray",
    "EncodedPage",
    "GroupResult",
    "JournalError",
    "NewEvent",
    "aappend_group_unpublished",
    "append_batch",
    "append_group_unpublished",
    "append_unpublished",
    "as_written",
    "check_cursor",
    "done_event",
    "envelopes",
    "read_after",
    "read_encoded",
    "read_encoded_array",
    "written_after",
]
