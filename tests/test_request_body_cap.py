"""Request bodies are capped before they are read: 413 `request_too_large` (hermesweb/body_limit.py).

Django checks DATA_UPLOAD_MAX_MEMORY_SIZE only after reading a body, and daphne (Twisted)
reads the whole body, past 100 kB into a temporary file, before the app sees the request.
Against a real daphne, a body declared too long is answered while none of it has been sent,
so none of it was held in memory or spooled to disk; a chunked body is cut off as it streams.
"""

from __future__ import annotations

import asyncio
import select
import socket
from typing import Any

import orjson
import pytest

from hermesweb.body_limit import MULTIPART_OVERHEAD, BodyLimit
from tests import factories
from tests.support.live import LiveStack, layer, live  # noqa: F401

MIB = 1024 * 1024
TIMEOUT = 30.0


class Answer:
    def __init__(self, raw: bytes) -> None:
        head, _, self.body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status = int(lines[0].split()[1])
        self.headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}

    def json(self) -> Any:
        return orjson.loads(self.body)


def read_answer(conn: socket.socket) -> Answer:
    conn.settimeout(TIMEOUT)
    raw = b""
    while True:
        try:
            chunk = conn.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        raw += chunk
        head, sep, body = raw.partition(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            ),
            None,
        )
        if sep and length is not None and len(body) >= length:
            break
    assert raw, "the server closed without answering"
    return Answer(raw)


def answered(conn: socket.socket) -> bool:
    return bool(select.select([conn], [], [], 0)[0])


def request(
    port: int,
    path: str,
    body_parts: list[bytes],
    headers: dict[str, str],
    *,
    stop_when_answered: bool = True,
) -> tuple[Answer, int]:
    """Send a request part by part, stopping as soon as the server answers; the answer and bytes sent."""
    conn = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    with conn:
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        conn.sendall(head.encode())
        sent = 0
        for part in body_parts:
            if stop_when_answered and answered(conn):
                break
            try:
                conn.sendall(part)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(part)
        return read_answer(conn), sent


def json_parts(size: int) -> list[bytes]:
    body = orjson.dumps({"client_id": "big", "text": "x" * (size - 40), "mode": "queue"})
    return [body[i : i + 64 * 1024] for i in range(0, len(body), 64 * 1024)]


def chunked(parts: list[bytes]) -> list[bytes]:
    return [f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts] + [b"0\r\n\r\n"]


@pytest.fixture
def web(live: LiveStack) -> LiveStack:
    live.start_daphne()
    return live


@pytest.fixture
def owned(web: LiveStack) -> tuple[Any, str]:
    """A session and a bearer token of its owner (the daphne process reads the same database)."""
    session = factories.SessionFactory()
    _, raw = factories.ApiToken.issue(session.project.owner, name="tests")
    return session, raw


def on_daphne(test: Any) -> Any:
    """A test against a real daphne process on the embedded layout."""
    test = pytest.mark.parametrize("layer", ["embedded"], indirect=True)(test)
    return pytest.mark.embedded(pytest.mark.django_db(transaction=True)(test))


@on_daphne
def test_a_body_declared_too_long_is_refused_before_any_of_it_is_sent(web: LiveStack) -> None:
    answer, sent = request(
        web.port,
        "/api/sessions/1/messages",
        [],
        {"Content-Type": "application/json", "Content-Length": str(3 * MIB)},
    )

    assert sent == 0
    assert answer.status == 413
    assert answer.json()["code"] == "request_too_large"
    assert answer.json()["details"]["limit"] == 2 * MIB


@on_daphne
def test_a_3_mib_json_message_is_refused_with_request_too_large(
    web: LiveStack, owned: tuple[Any, str]
) -> None:
    session, token = owned
    parts = json_parts(3 * MIB)

    answer, _ = request(
        web.port,
        f"/api/sessions/{session.pk}/messages",
        parts,
        {
            "Content-Type": "application/json",
            "Content-Length": str(sum(map(len, parts))),
            "Authorization": f"Bearer {token}",
        },
    )

    assert answer.status == 413
    assert answer.json()["code"] == "request_too_large"
    assert not session.intents.exists() and not session.runs.exists()


@on_daphne
def test_a_chunked_body_without_a_length_is_cut_off_once_it_passes_the_cap(
    web: LiveStack, owned: tuple[Any, str]
) -> None:
    session, token = owned
    parts = chunked(json_parts(16 * MIB))

    answer, sent = request(
        web.port,
        f"/api/sessions/{session.pk}/messages",
        parts,
        {
            "Content-Type": "application/json",
            "Transfer-Encoding": "chunked",
            "Authorization": f"Bearer {token}",
        },
    )

    assert answer.status == 413
    assert answer.json()["code"] == "request_too_large"
    assert sent < 16 * MIB  # the server answered part-way and stopped reading
    assert not session.runs.exists()


@on_daphne
def test_a_message_under_the_cap_goes_through(web: LiveStack, owned: tuple[Any, str]) -> None:
    session, token = owned
    body = orjson.dumps({"client_id": "small", "text": "y" * 1_000_000, "mode": "queue"})

    answer, _ = request(
        web.port,
        f"/api/sessions/{session.pk}/messages",
        [body],
        {
            "Content-Type": "application/json",
            "Content-Length": str(len(body)),
            "Authorization": f"Bearer {token}",
        },
        stop_when_answered=False,
    )

    assert answer.status == 202, answer.body
    assert len(session.runs.get().prompt_text) == 1_000_000


def multipart(content: bytes) -> tuple[bytes, str]:
    boundary = "hermeswebboundary"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="notes.txt"\r\n'
        "Content-Type: text/plain\r\n\r\n"
    ).encode()
    return body + content + f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


@on_daphne
def test_the_attachment_upload_may_carry_an_attachment_but_no_more(
    web: LiveStack, owned: tuple[Any, str], settings: Any
) -> None:
    session, token = owned
    body, content_type = multipart(b"z" * (3 * MIB))
    path = f"/api/sessions/{session.pk}/attachments"
    auth = {"Authorization": f"Bearer {token}", "Content-Type": content_type}

    uploaded, _ = request(
        web.port, path, [body], {**auth, "Content-Length": str(len(body))}, stop_when_answered=False
    )
    too_big = settings.HERMESWEB_ATTACHMENT_MAX_BYTES + MULTIPART_OVERHEAD + 1
    refused, sent = request(web.port, path, [], {**auth, "Content-Length": str(too_big)})

    assert uploaded.status == 201, uploaded.body
    assert refused.status == 413 and sent == 0
    assert refused.json()["code"] == "request_too_large"


# ---------------------------------------------------------------- the ASGI layer alone (any server)


class FakeApp:
    def __init__(self) -> None:
        self.called = False
        self.got: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.called = True
        while True:
            message = await receive()
            self.got.append(message)
            if message["type"] == "http.disconnect" or not message.get("more_body"):
                break
        if self.got[-1]["type"] == "http.request":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})


def run_asgi(
    headers: list[tuple[bytes, bytes]], chunks: list[bytes]
) -> tuple[FakeApp, list[dict[str, Any]], int]:
    """Drive BodyLimit around FakeApp; what the app got, what went out, and how many chunks were read."""
    app, sent = FakeApp(), []
    read = 0

    async def receive() -> dict[str, Any]:
        nonlocal read
        read += 1
        return {"type": "http.request", "body": chunks[read - 1], "more_body": read < len(chunks)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/api/sessions/1/messages", "headers": headers}
    asyncio.run(BodyLimit(app)(scope, receive, send))
    return app, sent, read


def test_the_asgi_layer_refuses_a_declared_length_without_calling_the_app() -> None:
    app, sent, read = run_asgi([(b"content-length", str(3 * MIB).encode())], [b"x"])

    assert not app.called and read == 0
    assert sent[0]["status"] == 413
    assert orjson.loads(sent[1]["body"])["code"] == "request_too_large"


def test_the_asgi_layer_stops_reading_a_stream_once_it_passes_the_cap() -> None:
    chunks = [b"x" * MIB] * 5

    app, sent, read = run_asgi([], chunks)

    assert read == 3  # 3 MiB > 2 MiB: the fourth and fifth chunks were never asked for
    assert app.got[-1]["type"] == "http.disconnect"
    assert [m.get("status") for m in sent if m["type"] == "http.response.start"] == [413]
