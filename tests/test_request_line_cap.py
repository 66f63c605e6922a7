"""An over-long URL or header line gets an answer from the real daphne, not a dropped connection:
414 `uri_too_long` and 431 `headers_too_large` (hermesweb/line_limit.py, docs/security.md "Limits")."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.support.procs import start_daphne

TIMEOUT = 30.0


@pytest.fixture
def port(transactional_db: None, logs: Path) -> Iterator[int]:
    proc, port = start_daphne(logs)
    try:
        yield port
    finally:
        proc.stop()


def exchange(port: int, head: bytes) -> bytes:
    """Send a request head; everything the server answers before it closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as conn:
        conn.sendall(head)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


def status_and_body(answer: bytes) -> tuple[int, dict[str, object]]:
    assert answer, "the server closed the connection without answering"
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), orjson.loads(body)


def test_a_30_kb_url_is_answered_414_uri_too_long(port: int) -> None:
    url = "/api/search?q=" + "a" * 30_000

    status, body = status_and_body(exchange(port, f"GET {url} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()))

    assert status == 414
    assert body["code"] == "uri_too_long" and body["details"] == {"limit": 16384}
    # A long URL under the limit still reaches the site: the API's own 401, not signed in.
    shorter = f"GET {url[:8_000]} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    assert status_and_body(exchange(port, shorter.encode()))[0] == 401


def test_a_30_kb_header_line_is_answered_431_headers_too_large(port: int) -> None:
    cookie = "x" * 30_000

    answer = exchange(port, f"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: {cookie}\r\n\r\n".encode())

    status, body = status_and_body(answer)
    assert status == 431 and body["code"] == "headers_too_large"
