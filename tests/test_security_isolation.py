"""Two users and a staff member against every route: nobody reaches another user's objects.

User A owns a project with a workflow, an idle session with a finished run, a busy one whose
active run waits on a permission request (and a question) with an intent queued behind it, and a
discovery job: the idle session is what PostgreSQL's one-statement submit acts on, the busy one
what the controls act on. B (an ordinary user) and S (staff, not superuser) each send every
method to every route of the URL conf and the OpenAPI schema, A's ids in the path, the query
and the body. Each answer must be a 404 — or, where
a route answers before any lookup (405 for a method it has not, 422 for a body it refuses), the
same answer A gets — never a 2xx, never a 5xx, never a trace of A's data; and A's rows stay as
they were. Routes with two ids are also sent one of A's ids among the caller's own.

A route the sweep cannot fill — a path parameter it has no object for, a body field it cannot
build, a documented operation whose owner request does not reach the object — fails the test,
as does a route missing from the allow-list of routes that name no object (NOT_OBJECT_SCOPED):
a new endpoint is covered here without a new test. The socket and the admin are checked below.
docs/security.md ("Between users").
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import re
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.admin import helpers
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection, transaction
from django.db.models import Count, Max, QuerySet
from django.test import Client
from django.urls import URLResolver, get_resolver
from django.utils import timezone
from websockets.sync.client import connect

from automations import services as automations
from automations.models import Firing, Trigger
from intents.models import PendingIntent
from projects.models import Project, Session, Workflow
from runs import search
from runs.attachments import Upload, do_upload_attachment
from runs.live.routing import websocket_urlpatterns
from runs.models import (
    AgentJob,
    AgentJobKind,
    AgentJobState,
    Attachment,
    Control,
    JournalEvent,
    Run,
    RunStatus,
    WarmRequest,
)
from tests import factories
from tests.conftest import token_client
from tests.support.api_objects import COLLECTIONS
from tests.support.live import LiveSocket, LiveStack, layer, live, session_cookie  # noqa: F401
from workspace.models import Checkpoint

pytestmark = pytest.mark.django_db(transaction=True)

METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
APPROVAL_ID, CLARIFY_ID, AGENT_SESSION_ID = "ap-1", "q-1", "agent-session-1"
# The owner's words in A's rows; none may appear in an answer to anyone else.
MARKER = "adasprivatemarker"

# Routes that name no user's object, and why. Those in SWEPT_UNSCOPED are still sent every
# method by every caller: they may succeed, but must carry nothing of A's and change nothing.
NOT_OBJECT_SCOPED = {
    "admin/": "the staff console, where staff inspect others' runs by design: test_the_admin_* below",
    "login/": "the sign-in form; a POST counts toward the lockout (tests/test_security_login.py)",
    "logout/": "signs the caller out",
    "": "the index page: a redirect to the caller's own last project",
    "api/": "the API root: a 404 that names the docs",
    "api/docs": "the OpenAPI page",
    "api/openapi.json": "the schema this sweep reads",
    "api/health": "the database's, the channel layer's and the runners' health",
    "api/agents": "the operator's configured agents, the same for every user (tests/test_api_agents.py)",
    "api/projects": "the caller's own projects: list, create",
    "api/search": "searches the caller's own turns (tests/test_search.py); swept for words A's turn holds",
    "api/tokens/revoke-all": "revokes the caller's own tokens (tests/test_security_tokens.py)",
    "api/<path:rest>": "the API's fallback: 404 for a path no route matched",
    "api/hooks/<secret>": "a webhook: its secret is the credential, cookies and tokens are ignored "
    "(tests/test_automations_webhooks.py); swept with what A's rows hold of it (its hash), a 404",
}
SWEPT_UNSCOPED: dict[str, Callable[[World], str]] = {
    "": lambda w: "/",
    "api/": lambda w: "/api/",
    "api/docs": lambda w: "/api/docs",
    "api/openapi.json": lambda w: "/api/openapi.json",
    "api/health": lambda w: "/api/health",
    "api/agents": lambda w: "/api/agents",
    "api/projects": lambda w: "/api/projects",
    # Words of A's finished turn other than the marker (the answer repeats the query).
    "api/search": lambda w: "/api/search?q=first+question",
    "api/<path:rest>": lambda w: f"/api/sessions/{w.idle.pk}/no-such-route",
    "api/hooks/<secret>": lambda w: f"/api/hooks/{w.webhook.secret_digest}",
}

# What a path parameter names: by its name, or for `id` by the collection before it.
NAMED = {
    "project_id": "project",
    "workflow_id": "workflow",
    "session_id": "session",
    "run_id": "run",
    "intent_id": "intent",
    "job_id": "job",
    "approval_id": "approval",
    "clarify_id": "clarify",
    "trigger_id": "trigger",
}
OBJECT_KINDS = {
    "project",
    "workflow",
    "session",
    "run",
    "intent",
    "job",
    "attachment",
    "checkpoint",
    "trigger",
}
# The files API's `path` query, by route: the project's top, and a file build_world writes there.
NOTES_FILE = "notes.txt"
QUERY_VALUES: dict[str, dict[str, Any]] = {
    "api/projects/<id>/files": {"path": ""},
    "api/projects/<id>/files/content": {"path": NOTES_FILE},
    "api/projects/<id>/files/search": {"q": "notes"},
    "api/runs/<id>/changes/lines": {"path": NOTES_FILE},
    "api/sessions/<id>/changes/lines": {"path": NOTES_FILE},
}
# A multipart upload's body (`POST /sessions/{id}/attachments`): a small text file.
MULTIPART = "multipart/form-data"
PARAM = re.compile(r"<(?:\w+:)?(\w+)>")


class Unclassified(Exception):
    """The sweep cannot fill this route: a new kind of endpoint that needs a look."""


# ---------------------------------------------------------------- the users and their objects


@dataclass
class World:
    """One user's objects: every kind a route can name."""

    user: Any
    project: Project
    workflow: Workflow
    idle: Session  # its one run finished
    busy: Session  # a run active, an intent waiting
    finished: Run
    active: Run
    intent: PendingIntent
    job: AgentJob
    attachment: Attachment  # uploaded to the idle session; its name and text carry the words
    schedule: Trigger  # on the workflow, with a firing that launched into the idle session
    webhook: Trigger
    checkpoint: Checkpoint  # of the idle session's run; its tree is not in any store

    def candidates(self, kind: str) -> list[Any]:
        """The values a parameter of this kind is tried with."""
        return {
            "project": [self.project.pk],
            "workflow": [self.workflow.pk],
            "session": [self.idle.pk, self.busy.pk],
            "run": [self.finished.pk, self.active.pk],
            "intent": [self.intent.pk],
            "job": [self.job.pk],
            "attachment": [self.attachment.pk],
            "trigger": [self.schedule.pk, self.webhook.pk],
            "checkpoint": [self.checkpoint.pk],
            "approval": [APPROVAL_ID],
            "clarify": [CLARIFY_ID],
        }[kind]

    def one(self, kind: str) -> Any:
        """The value an id in a body or a query takes: the idle session, the active run."""
        return self.active.pk if kind == "run" else self.candidates(kind)[0]


# Which parameters of one request must name related objects (a run of that session …).
RELATED = {
    ("run", "session"): (Run, "session_id"),
    ("intent", "session"): (PendingIntent, "session_id"),
    ("session", "project"): (Session, "project_id"),
    ("workflow", "project"): (Workflow, "project_id"),
    ("job", "project"): (AgentJob, "project_id"),
}


def related(values: dict[str, Any]) -> bool:
    """Whether the objects one request names belong together, as an owner's own request would."""
    for (child, parent), (model, column) in RELATED.items():
        if (
            child in values
            and parent in values
            and not model.objects.filter(pk=values[child], **{column: values[parent]}).exists()
        ):
            return False
    return True


def build_world(user: Any, words: str, root: Path) -> World:
    path = root / f"{words}-project"
    path.mkdir()
    project = factories.ProjectFactory(owner=user, name=f"{words} project", slug=f"{words}", path=str(path))
    workflow = factories.WorkflowFactory(
        project=project, name=f"{words} workflow", prompt_template=f"{words}: review {{file}}"
    )
    idle = factories.SessionFactory(project=project, title=f"{words} idle session")
    busy = factories.SessionFactory(project=project, title=f"{words} busy session")
    finished = factories.run_with_events(
        [
            ("run.started", {"status": "running"}),
            ("token.delta", {"message_id": "m1", "delta": f"{words} answer"}),
            ("done", {"state": "completed"}),
        ],
        session=idle,
        status=RunStatus.RUNNING,
        prompt_text=f"{words} first question",
    )
    options = [{"option_id": "allow", "name": "Allow"}, {"option_id": "reject", "name": "Reject"}]
    active = factories.run_with_events(
        [
            ("run.started", {"status": "running"}),
            ("approval.requested", {"approval_id": APPROVAL_ID, "title": f"{words} rm", "options": options}),
            ("clarify.requested", {"clarify_id": CLARIFY_ID, "question": f"{words} which branch?"}),
        ],
        session=busy,
        status=RunStatus.AWAITING_APPROVAL,
        prompt_text=f"{words} second question",
    )
    intent = factories.PendingIntentFactory(session=busy, text=f"{words} queued", position=0)
    listed = [{"agent_session_id": AGENT_SESSION_ID, "title": f"{words} agent session"}]
    job = AgentJob.objects.create(
        project=project,
        kind=AgentJobKind.LIST_SESSIONS,
        state=AgentJobState.DONE,
        result={"sessions": listed},
    )
    search.index_run(finished.pk)  # its words searchable, so a search by anyone else is swept for them
    attachment = do_upload_attachment(user, idle.pk, Upload(f"{words}.txt", [f"{words} notes\n".encode()]))
    (path / NOTES_FILE).write_text(f"{words} file\n")  # what the files API serves its owner
    # A tree no store holds: a restore of it is refused (409) before any file is touched.
    checkpoint = Checkpoint.objects.create(
        project=project, session=idle, run=finished, kind="start", tree="0" * 40
    )
    schedule = automations.do_create_trigger(
        workflow,
        kind="schedule",
        cron="0 7 * * 1-5",
        timezone_name="Europe/Berlin",
        variables={"file": words},
    ).trigger
    Firing.objects.create(
        trigger=schedule, planned_at=timezone.now(), outcome="launched", session=idle, run=finished
    )
    webhook = automations.do_create_trigger(workflow, kind="webhook", variables={"file": words}).trigger
    return World(
        user,
        project,
        workflow,
        idle,
        busy,
        finished,
        active,
        intent,
        job,
        attachment,
        schedule,
        webhook,
        checkpoint=checkpoint,
    )


def snapshot_queries(owner: Any) -> dict[str, QuerySet[Any]]:
    """Every row of the owner's, and the shape of each run's journal."""
    mine = {"project__owner": owner}
    in_session = {"session__project__owner": owner}
    return {
        "projects": Project.objects.filter(owner=owner).order_by("pk").values(),
        "workflows": Workflow.objects.filter(**mine).order_by("pk").values(),
        "sessions": Session.objects.filter(**mine).order_by("pk").values(),
        "runs": Run.objects.filter(**in_session).order_by("pk").values(),
        "controls": Control.objects.filter(run__session__project__owner=owner).order_by("pk").values(),
        "intents": PendingIntent.objects.filter(**in_session).order_by("pk").values(),
        "jobs": AgentJob.objects.filter(**mine).order_by("pk").values(),
        "attachments": Attachment.objects.filter(**in_session).order_by("pk").values(),
        "triggers": Trigger.objects.filter(workflow__project__owner=owner).order_by("pk").values(),
        "firings": Firing.objects.filter(trigger__workflow__project__owner=owner).order_by("pk").values(),
        "checkpoints": Checkpoint.objects.filter(**in_session).order_by("pk").values(),
        "warm_requests": WarmRequest.objects.filter(**in_session).order_by("pk").values(),
        "journal": JournalEvent.objects.filter(run__session__project__owner=owner)
        .values("run_id")
        .annotate(n=Count("pk"), top=Max("seq"))
        .order_by("run_id"),
    }


@functools.lru_cache(maxsize=8)
def snapshot_sql(owner_pk: Any) -> tuple[tuple[str, str, tuple[Any, ...]], ...]:
    # Compiled once: the sweep snapshots twice per request, and compiling nine querysets
    # each time was three quarters of its minute.
    owner = get_user_model().objects.get(pk=owner_pk)
    return tuple((name, *qs.query.sql_with_params()) for name, qs in snapshot_queries(owner).items())


def snapshot(owner: Any) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    with connection.cursor() as cursor:
        for name, sql, params in snapshot_sql(owner.pk):
            cursor.execute(sql, params)
            rows[name] = cursor.fetchall()
    return rows


def changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return [table for table in before if before[table] != after[table]]


@dataclass
class Caller:
    user: Any
    session: Client  # signed in: pages and API
    token: Client  # a personal API token: the API

    @classmethod
    def of(cls, user: Any) -> Caller:
        client = Client()
        client.force_login(user)
        return cls(user, client, token_client(user))

    def clients(self, template: str) -> list[tuple[str, Client]]:
        # Pages sign in with the session only; a token there is just an anonymous visitor.
        if template.startswith("api/"):
            return [("session", self.session), ("token", self.token)]
        return [("session", self.session)]


# ---------------------------------------------------------------- the routes


def url_conf_routes() -> list[str]:
    def walk(patterns: list[Any], prefix: str) -> Iterator[str]:
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, prefix + str(pattern.pattern))
            else:
                yield prefix + str(pattern.pattern)

    return sorted(set(walk(get_resolver().url_patterns, "")))


def allow_listed(template: str) -> bool:
    return template in NOT_OBJECT_SCOPED or template.startswith("admin/")


def openapi_path(template: str) -> str:
    return "/" + PARAM.sub(r"{\1}", template)


def param_kind(template: str, name: str) -> str:
    if name in NAMED:
        return NAMED[name]
    if name == "id":
        before = re.search(r"([\w-]+)/<(?:\w+:)?id>", template)
        if before and before.group(1) in COLLECTIONS:
            return COLLECTIONS[before.group(1)]
    raise Unclassified(f"{template}: no object for the path parameter {name!r} (map it in NAMED)")


# Values for body and query fields, by name; an id field names an object of that kind.
FIELD_IDS = {name: kind for name, kind in NAMED.items() if kind in OBJECT_KINDS}
FIELD_IDS["session"] = "session"  # the files, search and git routes' `?session=`: its tree
FIELD_VALUES: dict[str, Any] = {
    "option_id": "allow",
    "agent_session_id": AGENT_SESSION_ID,
    "variables": {"file": "README.md"},
    "version": 1,
    "position": 0,
    "action": "status",
    "answer": "sweep answer",
    "agent": "demo",
    "prompt_template": "Sweep {file}",
    "cron": "0 7 * * 1-5",
    "timezone": "Europe/Berlin",
    "at": None,  # with `cron`, a schedule has no instant
}


@dataclass
class Fill:
    """Builds one request's values; `pick` chooses whose object each id slot names."""

    schemas: dict[str, Any]
    root: Path
    pick: Callable[[str], World]
    slots: list[str] = field(default_factory=list)
    counter: itertools.count = field(default_factory=itertools.count)

    def resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in schema:
            schema = self.schemas[schema["$ref"].rsplit("/", 1)[-1]]
        return schema

    def value(self, slot: str, name: str, schema: dict[str, Any]) -> Any:
        if name in FIELD_IDS:
            self.slots.append(slot)
            return self.pick(slot).one(FIELD_IDS[name])
        if name in FIELD_VALUES:
            return FIELD_VALUES[name]
        if name == "client_id":
            return f"sweep-{next(self.counter)}"
        if name == "path":
            return tempfile.mkdtemp(prefix="sweep-", dir=self.root)
        return self.instance(slot, name, schema)

    def instance(self, slot: str, name: str, schema: dict[str, Any]) -> Any:
        schema = self.resolve(schema)
        if "anyOf" in schema:
            options = [s for s in schema["anyOf"] if self.resolve(s).get("type") != "null"]
            if not options:
                raise Unclassified(f"{slot}: no non-null choice in {schema}")
            return self.instance(slot, name, options[0])
        if "enum" in schema:
            return schema["enum"][0]
        kind = schema.get("type")
        if kind == "object":
            properties = schema.get("properties", {})
            return {key: self.value(f"{slot}.{key}", key, sub) for key, sub in properties.items()}
        if kind == "string":
            return "sweep"
        if kind == "integer":
            if name.endswith("_id") or name == "id":
                raise Unclassified(f"{slot}: an id field with no object for it (map it in NAMED)")
            return max(schema.get("minimum", 1), 0)
        if kind == "boolean":
            return True
        if kind == "array":
            return []
        raise Unclassified(f"{slot}: cannot build a value of {schema}")


@dataclass
class Probe:
    """One request, with whose object each id slot named."""

    template: str
    method: str
    client: str
    url: str
    body: Any
    declared: bool  # the route documents this method
    slots: list[str]

    def send(self, caller: Caller) -> Any:
        client = dict(caller.clients(self.template))[self.client]
        if self.body == MULTIPART:
            return client.post(self.url, {"file": SimpleUploadedFile("sweep.txt", b"sweep upload\n")})
        data = "" if self.body is None else json.dumps(self.body)
        return client.generic(self.method, self.url, data=data, content_type="application/json")

    def __str__(self) -> str:
        return f"{self.method} {self.url} ({self.client})"


def fill_path(template: str, names: list[str], values: tuple[Any, ...]) -> str:
    for name, value in zip(names, values, strict=True):
        template = re.sub(rf"<(?:\w+:)?{name}>", str(value), template, count=1)
    return template


def plan(
    template: str,
    operations: dict[str, Any],
    schemas: dict[str, Any],
    root: Path,
    pick: Callable[[str], World],
    one_owner: bool = True,
) -> list[Probe]:
    """Every probe of one route: each method, each combination of candidate ids, each client.

    With `one_owner`, only combinations whose objects belong together (a run of that session).
    """
    names = PARAM.findall(template)
    kinds = [param_kind(template, name) for name in names]
    per_slot = [pick(f"path.{name}").candidates(kind) for name, kind in zip(names, kinds, strict=True)]
    probes = []
    for values in itertools.product(*per_slot):
        if one_owner and not related(dict(zip(kinds, values, strict=True))):
            continue
        path = fill_path(template, names, values)
        for method in METHODS:
            fill = Fill(schemas, root, pick)
            fill.slots = [
                f"path.{name}" for name, kind in zip(names, kinds, strict=True) if kind in OBJECT_KINDS
            ]
            operation = operations.get(method.lower())
            query, body = {}, None
            if operation is not None:
                for parameter in operation.get("parameters", []):
                    where, name = parameter["in"], parameter["name"]
                    if where == "query" and name in QUERY_VALUES.get(template, {}):
                        query[name] = QUERY_VALUES[template][name]
                    elif where == "query":
                        query[name] = fill.value(f"query.{name}", name, parameter["schema"])
                    elif where != "path" and parameter.get("required"):
                        raise Unclassified(f"{template}: a required {where} parameter {name!r}")
                content = (operation.get("requestBody") or {}).get("content", {})
                if MULTIPART in content:
                    body = MULTIPART
                elif content:
                    if "application/json" not in content:
                        raise Unclassified(f"{method} {template}: a body that is not JSON")
                    body = fill.instance("body", "", content["application/json"]["schema"])
            elif template.startswith("api/") and method in ("POST", "PUT", "PATCH", "DELETE"):
                body = {}
            url = "/" + path
            if query:
                url += "?" + urlencode(
                    {k: json.dumps(v) if isinstance(v, bool) else v for k, v in query.items()}
                )
            declared = operation is not None or (not template.startswith("api/") and method == "GET")
            for client in ("session", "token") if template.startswith("api/") else ("session",):
                probes.append(Probe(template, method, client, url, body, declared, list(fill.slots)))
    return probes


def answer(response: Any) -> tuple[int, str | None]:
    """The status and, for a JSON error, its code: what two callers' answers are compared by."""
    code = None
    if response.get("Content-Type", "").startswith("application/json") and response.status_code >= 400:
        try:
            code = json.loads(response.content).get("code")
        except ValueError:
            code = None
    return response.status_code, code


def body_text(response: Any) -> str:
    content = b"".join(response.streaming_content) if response.streaming else response.content
    return content.decode(errors="replace")


# ---------------------------------------------------------------- the sweep


@dataclass
class Sweep:
    a: World
    other: World
    owner: Caller
    caller: Caller
    root: Path
    problems: list[str] = field(default_factory=list)
    requests: int = 0

    def routes(self) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
        response = self.owner.session.get("/api/openapi.json")
        assert response.status_code == 200
        schema = response.json()
        paths, schemas = schema["paths"], schema.get("components", {}).get("schemas", {})
        templates = url_conf_routes()
        served = {openapi_path(t) for t in templates if t.startswith("api/")}
        for path in paths:
            if path not in served:
                self.problems.append(f"{path}: in the OpenAPI schema but not in the URL conf")
        scoped = []
        for template in templates:
            if allow_listed(template):
                continue
            if template.startswith("api/") and openapi_path(template) not in paths:
                self.problems.append(f"{template}: an API route missing from the OpenAPI schema")
            elif not PARAM.search(template):
                self.problems.append(f"{template}: names no object and is not in NOT_OBJECT_SCOPED")
            else:
                scoped.append(template)
        return scoped, paths, schemas

    def plan_all(self, templates: list[str], paths: dict[str, Any], schemas: dict[str, Any]) -> list[Probe]:
        probes = []
        for template in templates:
            try:
                probes += plan(
                    template, paths.get(openapi_path(template), {}), schemas, self.root, lambda s: self.a
                )
            except Unclassified as exc:
                self.problems.append(f"unclassified: {exc}")
        return probes

    def owners_answers(self, probes: list[Probe]) -> dict[int, tuple[int, str | None]]:
        """What A gets for each probe, each sent in a transaction rolled back after it."""

        class RolledBack(Exception):
            pass

        answers = {}
        for index, probe in enumerate(probes):
            try:
                with transaction.atomic():
                    response = probe.send(self.owner)
                    raise RolledBack
            except RolledBack:
                pass
            answers[index] = answer(response)
            status, code = answers[index]
            if status >= 500:
                self.problems.append(f"{probe}: {status} for its owner")
            elif probe.declared and (status == 404 or code == "validation_error"):
                self.problems.append(
                    f"unclassified: {probe}: the owner's own request answers {status} {code}: the sweep's "
                    "request does not reach the object (teach Fill this route's parameters)"
                )
        return answers

    def check(self, probe: Probe, rule: Callable[[int, str | None], str | None]) -> None:
        before = snapshot(self.a.user)
        response = probe.send(self.caller)
        self.requests += 1
        status, code = answer(response)
        if status >= 500:
            self.problems.append(f"{probe}: {status} {code}")
        elif why := rule(status, code):
            self.problems.append(f"{probe}: {status} {code}: {why}")
        if MARKER in body_text(response):
            self.problems.append(f"{probe}: the answer carries A's data")
        if tables := changed(before, snapshot(self.a.user)):
            self.problems.append(f"{probe}: changed A's {', '.join(tables)}")

    def foreign_ids(self, probes: list[Probe], owners: dict[int, tuple[int, str | None]]) -> None:
        for index, probe in enumerate(probes):

            def rule(
                status: int, code: str | None, owner: tuple[int, str | None] = owners[index]
            ) -> str | None:
                if status == 404:
                    return None
                if status in (403, 405, 422) and (status, code) == owner:
                    return None  # answered before any lookup, the same to the owner
                return f"not a 404 (the owner gets {owner[0]} {owner[1]})"

            self.check(probe, rule)

    def mixed_ids(self, templates: list[str], paths: dict[str, Any], schemas: dict[str, Any]) -> None:
        """One of A's ids among the caller's own: never a success."""
        for template in templates:
            operations = paths.get(openapi_path(template), {})
            try:
                discovered = plan(template, operations, schemas, self.root, lambda s: self.a)
            except Unclassified:
                continue  # reported by plan_all
            slots = sorted({slot for probe in discovered for slot in probe.slots})
            if len(slots) < 2:
                continue
            for foreign in slots:
                pick = lambda slot, foreign=foreign: self.a if slot == foreign else self.other  # noqa: E731
                for probe in plan(template, operations, schemas, self.root, pick, one_owner=False):
                    if foreign not in probe.slots:
                        continue  # this method names none of A's objects (a list beside a create)
                    self.check(probe, lambda status, code: "a success" if status < 300 else None)

    def unscoped(self) -> None:
        """Routes that name no object: any answer but a 5xx, with nothing of A's in it."""
        for template, url in SWEPT_UNSCOPED.items():
            for method in METHODS:
                for client, _ in self.caller.clients(template):
                    body = {} if method in ("POST", "PUT", "PATCH", "DELETE") else None
                    probe = Probe(template, method, client, url(self.a), body, False, [])
                    self.check(probe, lambda status, code: None)


@pytest.mark.parametrize("who", ["user", "staff"])
def test_no_route_lets_another_user_or_staff_reach_a_users_objects(
    who: str, allowed_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="django.request")  # a thousand 404s and 405s
    ada = factories.UserFactory(username="ada")
    intruder = factories.UserFactory(username="sam" if who == "staff" else "bob", is_staff=who == "staff")
    a = build_world(ada, MARKER, allowed_root)
    other = build_world(intruder, f"{intruder.username}own", allowed_root)
    sweep = Sweep(a, other, Caller.of(ada), Caller.of(intruder), allowed_root)

    templates, paths, schemas = sweep.routes()
    probes = sweep.plan_all(templates, paths, schemas)
    owners = sweep.owners_answers(probes)
    before = snapshot(ada)
    sweep.foreign_ids(probes, owners)
    sweep.mixed_ids(templates, paths, schemas)
    sweep.unscoped()

    print(  # shown with -s, and when the test fails
        f"swept {len(templates)} object routes ({len(probes)} requests with A's ids, "
        f"{sweep.requests} as {intruder.username} in all, mixed ids and unscoped routes included)"
    )
    assert not sweep.problems, "\n".join(sweep.problems)
    assert snapshot(ada) == before
    # The sweep reached something: every scoped route of both worlds, with every method.
    assert len({p.template for p in probes}) == len(templates) >= 10
    assert sweep.requests >= len(probes)


def test_the_allow_list_names_only_routes_that_exist() -> None:
    templates = set(url_conf_routes())
    assert {t for t in NOT_OBJECT_SCOPED if t != "admin/"} <= templates
    assert any(t.startswith("admin/") for t in templates)
    assert set(SWEPT_UNSCOPED) <= set(NOT_OBJECT_SCOPED)


# ---------------------------------------------------------------- the socket


def socket_routes() -> list[str]:
    return [str(pattern.pattern) for pattern in websocket_urlpatterns]


def open_socket(live: LiveStack, path: str, user: Any) -> LiveSocket:
    ws = connect(
        f"ws://127.0.0.1:{live.port}{path}",
        origin=live.origin(),
        additional_headers={"Cookie": f"sessionid={session_cookie(user)}"},
        proxy=None,
        open_timeout=30,
        max_size=None,
    )
    return LiveSocket(live.sockets.enter_context(ws))


def user_sessions_frame(socket: LiveSocket) -> dict[str, Any]:
    socket.send(type="sessions")
    return socket.until(lambda f: f["type"] == "sessions")[-1]


def test_every_socket_route_closes_4404_for_another_user_and_for_staff(
    live: LiveStack, allowed_root: Path
) -> None:
    live.start_daphne()
    ada = factories.UserFactory(username="ada")
    a = build_world(ada, MARKER, allowed_root)
    bob = factories.UserFactory(username="bob")
    sam = factories.UserFactory(username="sam", is_staff=True)
    theirs = {user: build_world(user, f"{user.username}own", allowed_root) for user in (bob, sam)}
    before = snapshot(ada)

    routes = socket_routes()
    assert routes
    for template in routes:
        names = PARAM.findall(template)
        if not names:
            # A route of no object (the user's own sessions' live states): each user sees only theirs.
            own = user_sessions_frame(open_socket(live, "/" + template, ada))
            assert a.active.session_id in {s["id"] for s in own["sessions"]}  # the owner sees hers
            for intruder in (bob, sam):
                socket = open_socket(live, "/" + template, intruder)
                seen = {s["id"] for s in user_sessions_frame(socket)["sessions"]}
                assert seen.isdisjoint(ada.projects.values_list("sessions", flat=True)), (template, seen)
                assert not any(MARKER in json.dumps(frame) for frame in socket.frames)
            continue
        kinds = [param_kind(template, name) for name in names]  # Unclassified fails the test
        for values in itertools.product(*(a.candidates(kind) for kind in kinds)):
            named = dict(zip(kinds, values, strict=True))
            if not related(named):
                continue
            path = "/" + fill_path(template, names, values)
            mine = open_socket(live, path, ada)
            mine.subscribe()
            assert mine.session()["session_id"] == named["session"]  # the owner is let in
            for intruder in (bob, sam):
                socket = open_socket(live, path, intruder)
                assert socket.close_code(timeout=15) == 4404, (path, intruder.username)
                assert not any(MARKER in json.dumps(frame) for frame in socket.frames)

    # Ids in a frame: A's runs named as cursors on the intruder's own session are refused.
    for intruder, world in theirs.items():
        socket = open_socket(live, f"/ws/sessions/{world.busy.pk}/", intruder)
        socket.subscribe(after={a.finished.pk: 0, a.active.pk: 0})
        socket.session()
        frames = socket.frames + socket.quiet(1.0)
        refused = {f.get("run_id") for f in frames if f["type"] == "error"}
        assert refused == {a.finished.pk, a.active.pk}, frames
        assert not any(MARKER in json.dumps(frame) for frame in frames)
        assert not [f for f in frames if f["type"] == "event" and f["event"]["run_id"] in refused]

    assert snapshot(ada) == before


# ---------------------------------------------------------------- the admin


RUNS = "/admin/runs/run/"


def act(client: Client, action: str, run: Run) -> Any:
    return client.post(RUNS, {"action": action, helpers.ACTION_CHECKBOX_NAME: [run.pk], "index": 0})


def test_the_admin_sends_an_ordinary_user_to_its_login(allowed_root: Path) -> None:
    ada = factories.UserFactory(username="ada")
    a = build_world(ada, MARKER, allowed_root)
    bob = Caller.of(factories.UserFactory(username="bob"))
    before = snapshot(ada)

    for page in (
        "/admin/",
        RUNS,
        f"{RUNS}{a.active.pk}/change/",
        f"/admin/projects/session/{a.busy.pk}/change/",
        f"/admin/projects/project/{a.project.pk}/change/",
    ):
        response = bob.session.get(page)
        assert response.status_code == 302 and "/admin/login/" in response["Location"], page
    for action in ("mark_interrupted", "export_journal"):
        response = act(bob.session, action, a.active)
        assert response.status_code == 302 and "/admin/login/" in response["Location"], action
    assert snapshot(ada) == before


@pytest.mark.parametrize(
    ("permissions", "superuser", "may_export", "may_interrupt"),
    [
        ([], False, False, False),
        (["view_run"], False, True, False),
        (["change_run"], False, True, True),
        ([], True, True, True),
    ],
    ids=["staff", "staff with view_run", "staff with change_run", "superuser"],
)
def test_staff_view_others_runs_in_the_admin_and_act_only_with_the_permission(
    allowed_root: Path, permissions: list[str], superuser: bool, may_export: bool, may_interrupt: bool
) -> None:
    ada = factories.UserFactory(username="ada")
    a = build_world(ada, MARKER, allowed_root)
    sam = factories.UserFactory(username="sam", is_staff=True, is_superuser=superuser)
    for codename in permissions:
        sam.user_permissions.add(Permission.objects.get(codename=codename, content_type__app_label="runs"))
    staff = Caller.of(sam)
    before = snapshot(ada)

    # Viewing is any staff member's: the run's page shows A's transcript.
    page = staff.session.get(f"{RUNS}{a.active.pk}/change/")
    assert page.status_code == 200 and MARKER in page.content.decode()
    offered = page.content.decode()
    assert ("Mark interrupted" in offered) is may_interrupt
    assert ("Export journal" in offered) is may_export

    exported = act(staff.session, "export_journal", a.active)
    if may_export:
        assert exported["Content-Type"] == "application/x-ndjson"
        assert len(exported.content.splitlines()) == a.active.last_seq
    else:
        assert exported.get("Content-Type") != "application/x-ndjson"
        assert exported.status_code in (200, 302)  # the list again: no action it may run
    assert snapshot(ada) == before

    interrupted = act(staff.session, "mark_interrupted", a.active)
    assert interrupted.status_code in (200, 302)
    a.active.refresh_from_db()
    if may_interrupt:
        assert a.active.status == RunStatus.INTERRUPTED
    else:
        assert a.active.status == RunStatus.AWAITING_APPROVAL
        # The same action from the run's own page is refused too.
        posted = staff.session.post(
            f"{RUNS}{a.active.pk}/change/",
            {"CHANGE_FORM-action": "mark_interrupted", helpers.ACTION_CHECKBOX_NAME: [a.active.pk]},
        )
        assert posted.status_code in (302, 403)
        assert snapshot(ada) == before
