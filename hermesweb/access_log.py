"""daphne's access log as log records: through LOGGING, and its redaction, like every other line.

daphne writes its access log straight to a stream, past Python's logging, so a query string's
`?token=hw_…` or a search term went out in clear. Here each entry becomes a record of the
`hermesweb.access` logger (INFO), which the console handler's `RedactingLogFilter` masks as it
masks any line; the query's values are masked before that, because what a user searched for
has no secret's shape. docs/security.md, "Redaction".
"""

from __future__ import annotations

import datetime
import logging
import re
from typing import Any

from runs.redaction import REDACTED

access_log = logging.getLogger("hermesweb.access")

# Query values kept in the log: numbers and booleans (cursors, limits, flags) say how a request
# was made and carry nothing of the user's. Anything else is masked, parameter names kept.
_PLAIN_VALUE = re.compile(r"-?[0-9]{1,20}|true|false|True|False")


def masked_target(target: str) -> str:
    """A request target (path and query) with every query value masked but plain numbers and flags."""
    path, mark, query = target.partition("?")
    if not mark:
        return target
    kept = []
    for piece in query.split("&"):
        name, equals, value = piece.partition("=")
        if not equals:
            kept.append(piece if not piece or _PLAIN_VALUE.fullmatch(piece) else REDACTED)
        elif not value or _PLAIN_VALUE.fullmatch(value):
            kept.append(piece)
        else:
            kept.append(f"{name}={REDACTED}")
    return f"{path}?{'&'.join(kept)}"


def masked_request(request: str) -> str:
    """daphne's "METHOD target" (or "WSCONNECT target") with its target masked."""
    verb, space, target = request.partition(" ")
    return f"{verb}{space}{masked_target(target)}" if space else masked_target(request)


def write_entry(
    self: Any,
    host: str | None,
    date: datetime.datetime,
    request: str,
    status: int | None = None,
    length: int | None = None,
    ident: str | None = None,
    user: str | None = None,
) -> None:
    """daphne's `AccessLogGenerator.write_entry`, the same NCSA line, as a log record."""
    access_log.info(
        '%s %s %s [%s] "%s" %s %s',
        host,
        ident or "-",
        user or "-",
        date.strftime("%d/%b/%Y:%H:%M:%S"),
        masked_request(request),
        status or "-",
        length or "-",
    )


def route_daphne_access_log() -> None:
    """Send daphne's access log through logging (once; nothing under another ASGI server).

    daphne builds its access logger after it imported the application (hermesweb.asgi), so the
    class's method is replaced in time for every entry.
    """
    try:
        from daphne.access import AccessLogGenerator
    except ImportError:
        return
    AccessLogGenerator.write_entry = write_entry  # type: ignore[method-assign]
