"""One base for every refusal the domain answers on purpose: a status, a stable code, a message.

It lives here, low in the stack, so that domain actions, the runner and the web edge may all
import it (tests/test_layers.py forbids the domain to import `hermesweb`). The API answers any
`Refused` with one handler (hermesweb.errors); the session socket with one frame
(runs.live.consumer.refusal_frame).
"""

from __future__ import annotations

from typing import Any


class Refused(Exception):
    """A request refused on purpose: `status` as HTTP answers it, `code` for a program, `message`
    for a person, and `details` (the fields at fault, a limit, the current state) where given."""

    def __init__(self, status: int, code: str, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details
