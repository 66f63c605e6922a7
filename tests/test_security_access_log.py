"""daphne's access log goes through the same redaction as every other log line (issue 38, item 9).

A real daphne, started as bin/start and deploy/commands.sh start it, with its access log on:
a token in a query string and a search term must not reach its output; a request's method,
path, plain numeric parameters and status still do.
"""

from __future__ import annotations

import contextlib
import secrets
import urllib.error
import urllib.request

import pytest
from websockets.exceptions import InvalidStatus, WebSocketException
from websockets.sync.client import connect

from hermesweb.access_log import masked_request, masked_target
from runs.redaction import REDACTED
from tests.support.live import LiveStack, layer, live  # noqa: F401
from tests.support.procs import wait_for

TOKEN = "hw_" + secrets.token_urlsafe(32)  # an API token's shape (hermesweb.models.TOKEN_PREFIX)
SEARCH = "merger+with+acme+before+q3"  # what a user looked for is theirs, not the log's


def get(port: int, target: str) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://127.0.0.1:{port}{target}", timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return refused.code


@pytest.mark.embedded
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("layer", ["embedded"], indirect=True)
def test_the_access_log_masks_tokens_and_search_terms_but_keeps_the_request(live: LiveStack) -> None:
    port = live.start_daphne()
    get(port, f"/api/search?q={SEARCH}&limit=20")
    get(port, f"/api/health?token={TOKEN}")
    get(port, f"/api/runs/1/events?after_seq=5&access_token={secrets.token_hex(8)}")
    # A socket's handshake is logged too (WSCONNECTING), whatever its query holds.
    with (
        contextlib.suppress(InvalidStatus, WebSocketException, OSError),
        connect(f"{live.url(1)}?token={TOKEN}", origin=live.origin(), proxy=None, open_timeout=30),
    ):
        pass

    daphne = live.daphne
    assert daphne is not None

    def logged() -> str | None:
        text = daphne.log()
        return text if text.count('"GET /api/') >= 3 and "WSCONNECTING" in text else None

    log = wait_for(logged, 30, what="daphne to log the requests")
    assert TOKEN not in log and TOKEN[3:] not in log
    assert SEARCH not in log and "merger" not in log and "acme" not in log
    # The lines are there, with what identifies the request and nothing of what it carried.
    assert f'"GET /api/search?q={REDACTED}&limit=20" 401' in log
    assert f'"GET /api/health?token={REDACTED}"' in log
    assert f'"GET /api/runs/1/events?after_seq=5&access_token={REDACTED}" 401' in log


@pytest.mark.parametrize(
    ("target", "logged"),
    [
        ("/api/sessions/4/transcript", "/api/sessions/4/transcript"),
        ("/api/runs/1/events?after_seq=5&limit=10", "/api/runs/1/events?after_seq=5&limit=10"),
        ("/api/projects?include_archived=true", "/api/projects?include_archived=true"),
        ("/api/search?q=quarterly&limit=5", f"/api/search?q={REDACTED}&limit=5"),
        ("/api/export?format=json&x=", f"/api/export?format={REDACTED}&x="),
        (f"/?{TOKEN}", f"/?{REDACTED}"),
    ],
    # Named by index: the token is random, and xdist's workers must collect the same ids.
    ids=["plain-path", "numbers", "flag", "search", "word", "bare-token"],
)
def test_query_values_are_masked_but_plain_numbers_and_flags(target: str, logged: str) -> None:
    assert masked_target(target) == logged
    assert masked_request(f"GET {target}") == f"GET {logged}"
