"""Unicode and encoding edge cases on every JSON body and on the session socket's frames (issue 23).

Each body the API takes (enumerated from the OpenAPI document, so a new endpoint is covered
without a line here) gets, in each of its string fields, a NUL, a lone surrogate (raw JSON
"\\ud800"), right-to-left and bidi controls, and a 1 MiB string; and, as the whole body, JSON
nested 10 000 levels deep and bytes that are not UTF-8. Every answer is a 2xx or a 4xx with a
machine-readable `code`, never a 5xx, and a refused request writes no row. Text that is
legitimately acceptable (RTL) is stored and read back exactly. The socket's submit and subscribe
frames get the same, in-process (channels' WebsocketCommunicator, no server).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import orjson
import pytest
from channels.testing import WebsocketCommunicator
from django.test import Client

from hermesweb.api import api as ninja_api
from intents.models import PendingIntent
from projects.models import Project, Session, Workflow
from runs.models import AgentJob, Attachment, Control, JournalEvent, Run, RunStatus
from tests import factories

pytestmark = pytest.mark.timeout(120)

# Overrides, isolates and marks around Hebrew (shalom) and Arabic (marhaba) words.
RTL = (
    "\u202eevil.txt\u202c \u2067\u05e9\u05dc\u05d5\u05dd\u2069 "
    "\u200f\u0645\u0631\u062d\u0628\u0627\u200e \u2066x\u2069"
)
# Raw JSON for a string value: what a client can send, escapes and all.
STRING_PAYLOADS: dict[str, bytes] = {
    "nul": b'"a\\u0000b"',
    "lone_surrogate": b'"x\\ud800y"',
    "rtl": orjson.dumps(RTL),
    "one_mebibyte": b'"' + b"x" * (1 << 20) + b'"',
}
WHOLE_BODIES: dict[str, bytes] = {
    "nested_10k": b'{"a": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
    "invalid_utf8": b'{"text": "caf\xc3\x28 \xff\xfe", "name": "\xed\xa0\x80"}',
    # Not unicode, but found with it: ninja read a JSON scalar as an object without fields.
    "not_an_object": b"false",
}
MODELS = (Project, Workflow, Session, Run, JournalEvent, Control, PendingIntent, AgentJob, Attachment)
PLACEHOLDER = "\u2603placeholder\u2603"


@pytest.fixture(scope="module", autouse=True)
def figures() -> Iterator[None]:
    """The module's figures on a FIGURE line (`-rP` shows it), for docs/reliability.md."""
    yield
    print(
        f"FIGURE unicode inputs: {len(OPERATIONS)} JSON body operations, {len(cases())} bodies "
        f"({len(STRING_PAYLOADS)} string payloads per text field, {len(WHOLE_BODIES)} whole bodies), "
        f"{len(SOCKET_EXCHANGES) + 1} socket frames, {len(ROUND_TRIPS)} RTL round trips"
    )


def row_counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in MODELS}


class BodyOperation(NamedTuple):
    method: str
    path: str
    string_fields: list[str]


def document() -> dict[str, Any]:
    return orjson.loads(
        orjson.dumps(ninja_api.get_openapi_schema(path_prefix="/api"), option=orjson.OPT_NON_STR_KEYS)
    )


def takes_string(field: dict[str, Any]) -> bool:
    options = field.get("anyOf", [field])
    return any(option.get("type") == "string" for option in options)


def takes_map_of_strings(field: dict[str, Any]) -> bool:
    options = field.get("anyOf", [field])
    return any(
        option.get("type") == "object"
        and isinstance(option.get("additionalProperties"), dict)
        and takes_string(option["additionalProperties"])
        for option in options
    )


def json_body_operations() -> list[BodyOperation]:
    """Every operation with a JSON body, and the top-level fields of that body that take text."""
    doc = document()
    components = doc["components"]["schemas"]
    found = []
    for path, methods in doc["paths"].items():
        for method, operation in methods.items():
            content = operation.get("requestBody", {}).get("content", {})
            if "application/json" not in content:
                continue
            body = content["application/json"]["schema"]
            while "$ref" in body or "anyOf" in body:
                ref = body.get("$ref") or next(o["$ref"] for o in body["anyOf"] if "$ref" in o)
                body = components[ref.rsplit("/", 1)[-1]]
            properties = body.get("properties", {}).items()
            fields = [name for name, field in properties if takes_string(field)]
            # A map of text (workflow variables, a structured answer): the payload as a key's value.
            fields += [f"{name}.k" for name, field in properties if takes_map_of_strings(field)]
            found.append(BodyOperation(method.upper(), path, fields))
    return found


OPERATIONS = json_body_operations()


def valid_bodies(o: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A body each operation accepts, for the fields a payload does not replace (default: {})."""
    return {
        "POST /api/projects": {"name": "p", "path": str(o["new_dir"])},
        "POST /api/projects/{id}/workflows": {"name": "w", "prompt_template": "Hi {x}"},
        "POST /api/workflows/{id}/launch": {"variables": {"thing": "it"}},
        "POST /api/sessions/{id}/messages": {"client_id": "c1", "text": "hi"},
        "POST /api/runs/{id}/approvals/{approval_id}": {"option_id": "allow"},
        "POST /api/runs/{id}/clarifications/{clarify_id}": {"answer": "yes"},
        "POST /api/sessions/{id}/goal": {"action": "set", "text": "ship it"},
        "POST /api/projects/{id}/import": {"agent_session_id": "agent-1"},
        "PATCH /api/intents/{id}": {"version": o["intent_version"], "text": "edited"},
    }


@pytest.fixture
def objects(user: Any, allowed_root: Path) -> dict[str, Any]:
    workflow = factories.WorkflowFactory(project__owner=user, prompt_template="Do {thing}")
    run = factories.run_with_events(
        [
            ("run.started", {"status": "running"}),
            ("approval.requested", {"approval_id": "a1", "options": [{"option_id": "allow"}]}),
            ("clarify.requested", {"clarify_id": "q1", "question": "?"}),
        ],
        session__project=workflow.project,
        status=RunStatus.AWAITING_APPROVAL,
    )
    intent = factories.PendingIntentFactory(session=run.session)
    new_dir = allowed_root / "new"
    new_dir.mkdir()
    return {
        "projects": workflow.project_id,
        "workflows": workflow.pk,
        "sessions": run.session_id,
        "runs": run.pk,
        "intents": intent.pk,
        "intent_version": intent.version,
        "new_dir": new_dir,
    }


def url(path: str, objects: dict[str, Any]) -> str:
    kind = path.split("/")[2]
    path = path.replace("{approval_id}", "a1").replace("{clarify_id}", "q1")
    return path.replace("{id}", str(objects.get(kind, 1)))


def with_payload(base: dict[str, Any], field: str, payload: bytes) -> bytes:
    """`base` with `field` set to the raw JSON `payload` (escapes kept as the client wrote them)."""
    name, _, key = field.partition(".")
    text = orjson.dumps({**base, name: {key: PLACEHOLDER} if key else PLACEHOLDER})
    return text.replace(orjson.dumps(PLACEHOLDER), payload)


def assert_clear_answer(response: Any, before: dict[str, int], what: str) -> None:
    assert response.status_code < 500, (what, response.status_code, response.content[:300])
    if response.status_code >= 400:
        error = response.json()
        assert isinstance(error.get("code"), str) and error["code"], (what, error)
        assert row_counts() == before, f"{what}: a refused request wrote rows"


def cases() -> list[Any]:
    params = []
    for operation in OPERATIONS:
        label = f"{operation.method} {operation.path}"
        for field in operation.string_fields:
            for name in STRING_PAYLOADS:
                params.append(pytest.param(operation, field, name, id=f"{label}-{field}-{name}"))
        for name in WHOLE_BODIES:
            params.append(pytest.param(operation, None, name, id=f"{label}-{name}"))
    return params


@pytest.mark.django_db
@pytest.mark.parametrize(("operation", "field", "payload"), cases())
def test_every_json_body_answers_unicode_edge_cases_with_a_coded_4xx_or_takes_them(
    bearer: Client,
    objects: dict[str, Any],
    operation: BodyOperation,
    field: str | None,
    payload: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    label = f"{operation.method} {operation.path}"
    base = valid_bodies(objects).get(label, {})
    body = WHOLE_BODIES[payload] if field is None else with_payload(base, field, STRING_PAYLOADS[payload])
    before = row_counts()

    with caplog.at_level(logging.ERROR, logger="hermesweb.api"):
        response = bearer.generic(
            operation.method, url(operation.path, objects), body, content_type="application/json"
        )

    assert_clear_answer(response, before, f"{label} {field} {payload}")
    if payload in ("nul", "lone_surrogate", "nested_10k", "invalid_utf8", "not_an_object"):
        # Nothing can store these: each is refused whole, not cut or replaced.
        assert 400 <= response.status_code < 500, (label, field, payload, response.content[:300])
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_every_json_body_operation_is_swept() -> None:
    # The sweep is built from the document: an operation with a JSON body cannot be left out.
    labels = {f"{o.method} {o.path}" for o in OPERATIONS}
    assert {"POST /api/sessions/{id}/messages", "PATCH /api/sessions/{id}", "POST /api/projects"} <= labels
    fields = {f"{o.method} {o.path}": o.string_fields for o in OPERATIONS}
    assert "variables.k" in fields["POST /api/workflows/{id}/launch"]
    assert {"client_id", "text"} <= set(fields["POST /api/sessions/{id}/messages"])


# ---------------------------------------------------------------- RTL: stored and read back exactly


class RoundTrip(NamedTuple):
    write: Callable[[Client, dict[str, Any]], Any]
    read: Callable[[Client, dict[str, Any]], str]


ROUND_TRIPS = {
    "project name": RoundTrip(
        lambda c, o: c.patch(
            f"/api/projects/{o['projects']}", {"name": RTL}, content_type="application/json"
        ),
        lambda c, o: c.get(f"/api/projects/{o['projects']}").json()["name"],
    ),
    "session title": RoundTrip(
        lambda c, o: c.patch(
            f"/api/sessions/{o['sessions']}", {"title": RTL}, content_type="application/json"
        ),
        lambda c, o: c.get(f"/api/sessions/{o['sessions']}").json()["title"],
    ),
    "workflow template": RoundTrip(
        lambda c, o: c.patch(
            f"/api/workflows/{o['workflows']}", {"prompt_template": RTL}, content_type="application/json"
        ),
        lambda c, o: c.get(f"/api/workflows/{o['workflows']}").json()["prompt_template"],
    ),
    "queued message": RoundTrip(
        lambda c, o: c.post(
            f"/api/sessions/{o['sessions']}/messages",
            {"client_id": "rtl", "text": RTL, "mode": "queue"},
            content_type="application/json",
        ),
        lambda c, o: c.get(f"/api/sessions/{o['sessions']}/intents").json()["intents"][-1]["text"],
    ),
    "edited intent": RoundTrip(
        lambda c, o: c.patch(
            f"/api/intents/{o['intents']}",
            {"version": o["intent_version"], "text": RTL},
            content_type="application/json",
        ),
        lambda c, o: c.get(f"/api/sessions/{o['sessions']}/intents").json()["intents"][0]["text"],
    ),
}


@pytest.mark.django_db
@pytest.mark.parametrize("what", ROUND_TRIPS)
def test_rtl_and_bidi_text_is_stored_and_read_back_exactly(
    bearer: Client, objects: dict[str, Any], what: str
) -> None:
    trip = ROUND_TRIPS[what]

    written = trip.write(bearer, objects)

    assert 200 <= written.status_code < 300, written.content
    assert trip.read(bearer, objects) == RTL


# ---------------------------------------------------------------- the session socket


class Exchange(NamedTuple):
    frame: str | bytes
    answer: Callable[[dict[str, Any]], bool]


def refused_submit(client_id: str) -> Callable[[dict[str, Any]], bool]:
    def check(frame: dict[str, Any]) -> bool:
        error = frame.get("error") or {}
        return (
            frame["type"] == "submitted"
            and frame["client_id"] == client_id
            and 400 <= error.get("status", 0) < 500
            and bool(error.get("code"))
        )

    return check


def bad_request(frame: dict[str, Any]) -> bool:
    return frame["type"] == "error" and frame["code"] == "bad_request"


def submit(client_id: str, text: bytes) -> str:
    return (b'{"type": "submit", "client_id": "' + client_id.encode() + b'", "text": ' + text + b"}").decode()


SOCKET_EXCHANGES = {
    "nul in a submit": Exchange(submit("nul", STRING_PAYLOADS["nul"]), refused_submit("nul")),
    "nul in a client id": Exchange(submit("n\\u0000", b'"hi"'), bad_request),
    "lone surrogate": Exchange(submit("sur", STRING_PAYLOADS["lone_surrogate"]), bad_request),
    "one mebibyte": Exchange(submit("big", STRING_PAYLOADS["one_mebibyte"]), bad_request),
    "nested 10k": Exchange('{"type": "submit", "x": ' + "[" * 10_000 + "]" * 10_000 + "}", bad_request),
    "invalid utf-8 (binary)": Exchange(b'{"type": "ping", "x": "\xff\xfe"}', bad_request),
    "nul in a cursor": Exchange('{"type": "subscribe", "after": {"1\\u0000": 1}}', bad_request),
    "rtl in a cursor": Exchange('{"type": "subscribe", "after": {"\u202e1": 1}}', bad_request),
}


async def exchange_all(cookie: str, session_id: int) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    from hermesweb.asgi import application

    headers = [
        (b"host", b"localhost"),
        (b"origin", b"http://localhost"),
        (b"cookie", f"sessionid={cookie}".encode()),
    ]
    communicator = WebsocketCommunicator(application, f"/ws/sessions/{session_id}/", headers)
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    answers: dict[str, dict[str, Any]] = {}
    try:
        for name, sent in SOCKET_EXCHANGES.items():
            if isinstance(sent.frame, bytes):
                await communicator.send_to(bytes_data=sent.frame)
            else:
                await communicator.send_to(text_data=sent.frame)
            answers[name] = orjson.loads(await communicator.receive_from(timeout=10))
        await communicator.send_to(
            text_data=orjson.dumps({"type": "submit", "client_id": "rtl", "text": RTL}).decode()
        )
        accepted = orjson.loads(await communicator.receive_from(timeout=10))
        await communicator.send_to(text_data='{"type": "ping"}')
        answers["still open"] = orjson.loads(await communicator.receive_from(timeout=10))
    finally:
        await communicator.disconnect()
    return answers, accepted


@pytest.mark.django_db(transaction=True)
def test_socket_frames_with_unicode_edge_cases_are_refused_with_a_code_and_write_nothing(
    user: Any,
) -> None:
    session = factories.SessionFactory(project__owner=user)
    cookie = Client()
    cookie.force_login(user)

    answers, accepted = asyncio.run(exchange_all(cookie.cookies["sessionid"].value, session.pk))

    for name, sent in SOCKET_EXCHANGES.items():
        assert sent.answer(answers[name]), (name, answers[name])
    assert answers["still open"] == {"type": "pong"}
    run = Run.objects.get()  # only the RTL message became a turn
    assert accepted["result"]["run_id"] == run.pk
    assert run.prompt_text == RTL
