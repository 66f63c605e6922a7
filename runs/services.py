"""Domain actions for user messages: a new turn, or a pending intent (docs/intents.md).

Persist before dispatch: every action commits its rows first and rings the
runner's doorbell only after the commit. Client-generated ids make each
submission idempotent: the same `client_id` on a session yields the first
answer again, with `duplicate=True`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache, reduce
from typing import Any, Protocol

from django.conf import settings
from django.db import IntegrityError, connection, transaction

from intents import services as intent_services
from intents.models import PendingIntent
from projects.models import SESSION_OWNER, Project, ProjectStatus, Session, SessionStatus, Workflow
from projects.refusals import Refused
from projects.services import hold_session_room
from runs import notify
from runs.attachments import describe_for_message
from runs.messages import NewMessage
from runs.models import ACTIVE_STATUSES, Attachment, Run, RunSource
from workspace.mentions import describe_mentions

MESSAGE_MODES = ("auto", "queue", "steer")
STEER_WITH_FILES = {
    "requested": "steer",
    "fallback": "Attachments are sent with a turn of their own, not a steer.",
}


class Guard(Protocol):
    """A condition the caller's write depends on, checkable in SQL (hermesweb.auth.StillSignedIn)."""

    def sql(self) -> tuple[str, list[Any]]: ...

    def holds(self) -> bool: ...


class GuardFailed(Exception):
    """The caller's guard no longer holds: nothing was written."""


class SubmitRefused(Refused):
    def __init__(self, code: str, message: str) -> None:
        # As HTTP: the message itself is wrong (422), or the session's state forbids it (409).
        if code == "not_found":
            status = 404
        else:
            status = 422 if code in ("invalid_mode", "empty_message", "queue_full") else 409
        super().__init__(status, code, message)


@dataclass(frozen=True)
class SendRefusal:
    """A state of the message's session that refuses it: the Session lookup `lookup` equals `value`."""

    lookup: str  # "status", "project__status", …
    value: str
    code: str
    message: str

    def refuses(self, session: Session) -> bool:
        return reduce(getattr, self.lookup.split("__"), session) == self.value


# Who may send to a session and what refuses a message, stated once: the full path checks the
# locked session against them, the one-statement path (_new_turn_statement) compiles them to SQL.
# The full path refuses in this order.
SEND_REFUSALS = (
    SendRefusal(
        "project__status",
        ProjectStatus.ARCHIVED,
        "project_archived",
        "This project is archived; restore it to send.",
    ),
    SendRefusal(
        "status",
        SessionStatus.ARCHIVED,
        "session_archived",
        "This session is archived; unarchive it to send.",
    ),
)


@dataclass
class SubmitResult:
    kind: str  # "run" | "queue" | "steer"
    run: Run | None
    intent: PendingIntent | None
    status: str
    duplicate: bool

    @property
    def run_id(self) -> int | None:
        return self.run.pk if self.run else None

    @property
    def intent_id(self) -> int | None:
        return self.intent.pk if self.intent else None


def _intent_result(intent: PendingIntent, duplicate: bool) -> SubmitResult:
    # A stop-and-send item was submitted as a queued message: answer in the message's terms.
    kind = "steer" if intent.kind == "steer" else "queue"
    if intent.run_id is not None and kind == "queue":
        # It already drained into a turn: answer with the turn.
        return SubmitResult(kind, intent.run, intent, intent.state, duplicate)
    return SubmitResult(kind, None, intent, intent.state, duplicate)


def _previous_answer(session_id: int, client_id: str) -> SubmitResult | None:
    """The answer a first submission of `client_id` got, if there was one."""
    intent = PendingIntent.objects.filter(session_id=session_id, client_id=client_id).first()
    if intent is not None:
        return _intent_result(intent, duplicate=True)
    run = Run.objects.filter(session_id=session_id, client_id=client_id).first()
    if run is not None:
        return SubmitResult("run", run, None, run.status, duplicate=True)
    return None


def do_submit_message(
    session: Session,
    *,
    client_id: str,
    text: str,
    mode: str = "auto",
    attachments: Sequence[dict[str, Any]] | None = None,
    source: str = RunSource.COMPOSER,
    source_meta: dict[str, Any] | None = None,
) -> SubmitResult:
    """Accept a user message: a new turn when the session is idle, else a pending intent.

    While a run is active the explicit `mode` decides, else the project's
    `running_default`: Queue waits for the run to end, Steer is delivered to the
    active run (docs/intents.md).
    """
    message = NewMessage(client_id, text, mode, tuple(attachments or ()), source, dict(source_meta or {}))
    return _submit(session.pk, None, message)


def do_submit_message_as(
    user: Any,
    session_id: int,
    *,
    client_id: str,
    text: str,
    mode: str = "auto",
    attachments: Sequence[int] | None = None,
    guard: Guard | None = None,
    mentions: Sequence[str] | None = None,
) -> SubmitResult:
    """do_submit_message from the composer, to a session `user` may see (else Session.DoesNotExist).

    The visibility check is the locking read itself: the API does not read the session first.
    With a `guard`, nothing is written unless it holds (else GuardFailed): the common case
    checks it in the statement that writes. `attachments` are ids of that session's uploads,
    stored on the turn (or intent) as {id, name, mime_type, size}; any other id is refused,
    404 `not_found`.
    """
    described: list[dict[str, Any]] = []
    if attachments:
        try:
            described = describe_for_message(user, session_id, attachments)
        except Attachment.DoesNotExist:
            raise SubmitRefused("not_found", "No such attachment.") from None
    if mentions:  # `@` paths ride with the uploads (workspace/mentions.py): as durable, as idempotent
        described += describe_mentions(mentions)
    return _submit(session_id, user, NewMessage(client_id, text, mode, tuple(described)), guard)


def _submit(
    session_id: int, viewer: Any | None, message: NewMessage, guard: Guard | None = None
) -> SubmitResult:
    if message.mode not in MESSAGE_MODES:
        raise SubmitRefused("invalid_mode", f"mode must be one of {', '.join(MESSAGE_MODES)}")
    if not message.text.strip():
        raise SubmitRefused("empty_message", "A message needs some text.")
    client_id = message.client_id
    if _fast_new_turn_applies():
        run = insert_new_turn(session_id, viewer, message, guard)
        if run is not None:  # its statement rang the runners
            notify.publish_session_changed(session_id, viewer.pk if viewer is not None else None)
            return SubmitResult("run", run, None, run.status, duplicate=False)
    if guard is not None and not guard.holds():
        raise GuardFailed
    try:
        with transaction.atomic():
            locked = Session.objects.lock(session_id, visible_to=viewer)
            claims = _client_id_claims(locked.pk, client_id)
            if "intent" in claims:
                return _intent_result(PendingIntent.objects.get(pk=claims["intent"]), duplicate=True)
            if "mine" in claims:
                run = Run.objects.get(pk=claims["mine"])
                return SubmitResult("run", run, None, run.status, duplicate=True)
            for refusal in SEND_REFUSALS:
                if refusal.refuses(locked):
                    raise SubmitRefused(refusal.code, refusal.message)
            if "active" not in claims:
                run = Run.objects.create(
                    session=locked,
                    client_id=client_id,
                    prompt_text=message.text,
                    attachments=list(message.attachments),
                    source=message.source,
                    source_meta=dict(message.source_meta),
                )
                Session.objects.filter(pk=locked.pk).update(updated_at=run.created_at)
                notify.wake_runners("run.queued", run.pk)
                owner = locked.project.owner_id
                notify.publish_on_commit(notify.publish_session_changed, locked.pk, owner)
                return SubmitResult("run", run, None, run.status, duplicate=False)
            active = Run.objects.get(pk=claims["active"])
            # Every open intent rides in each socket snapshot: past a cap, one session's queue
            # could outgrow the frame limit (docs/security.md). Counted under the session lock.
            limit = settings.HERMESWEB_MAX_QUEUED_INTENTS
            if PendingIntent.objects.filter(session_id=locked.pk).open().count() >= limit:
                raise SubmitRefused("queue_full", f"This session already has {limit} waiting messages.")
            effective = message.mode if message.mode != "auto" else locked.project.running_default
            if effective == "steer" and not message.attachments:
                intent = intent_services.request_steer(locked, active, message)
            else:
                # A steer carries text only: a message with attachments waits for its own turn.
                steered = effective == "steer"
                if steered:
                    message = replace(message, source_meta={**message.source_meta, **STEER_WITH_FILES})
                reason = STEER_WITH_FILES["fallback"] if steered else ""
                intent = intent_services.enqueue_message(locked, message, reason=reason)
            return _intent_result(intent, duplicate=False)
    except IntegrityError:
        # Two identical submissions raced past the lookup; the winner's answer stands.
        previous = _previous_answer(session_id, client_id)
        if previous is None:
            raise
        return previous


def _client_id_claims(session_id: int, client_id: str) -> dict[str, int]:
    """In one read: the intent and the run `client_id` already made here, and the active run.

    Keys "intent", "mine", "active", each present only when there is one. One read, not
    two: a submit is on the way to every first token.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            _claims_statement(),
            [session_id, client_id, client_id, session_id, client_id, *ACTIVE_STATUSES],
        )
        # A run of this client id that is still active is "mine" (a repeat), not "active".
        return {kind: pk for kind, pk in cursor.fetchall()}


@lru_cache(maxsize=1)
def _claims_statement() -> str:
    quote = connection.ops.quote_name
    run, intent = quote(Run._meta.db_table), quote(PendingIntent._meta.db_table)
    active = ", ".join(["%s"] * len(ACTIVE_STATUSES))
    return (
        f"SELECT 'intent', id FROM {intent} WHERE session_id = %s AND client_id = %s "
        f"UNION ALL SELECT CASE WHEN client_id = %s THEN 'mine' ELSE 'active' END, id FROM {run} "
        f"WHERE session_id = %s AND (client_id = %s OR status IN ({active}))"
    )


def _fast_new_turn_applies() -> bool:
    # Only as a statement of its own: inside a caller's transaction a constraint it trips
    # would abort that transaction, and the full path could not run after it.
    return connection.vendor == "postgresql" and not connection.in_atomic_block


def new_turn_in_one_statement(
    session_id: int,
    viewer: Any | None,
    client_id: str,
    text: str,
    attachments: Sequence[dict[str, Any]] | None,
    source: str,
    source_meta: dict[str, Any] | None,
    guard: Guard | None,
) -> Run | None:
    """insert_new_turn with the message given field by field (tests/test_submit_fast_path.py)."""
    message = NewMessage(client_id, text, "auto", tuple(attachments or ()), source, dict(source_meta or {}))
    return insert_new_turn(session_id, viewer, message, guard)


def insert_new_turn(
    session_id: int, viewer: Any | None, message: NewMessage, guard: Guard | None
) -> Run | None:
    """The common submit, a new turn of an idle session, as one statement that commits alone.

    A fast path that decides as the full path does, in SQL: it pays about a fifth of the first
    token's added time (bench/README.md). Who may send and what refuses a message it compiles
    from the full path's own definitions (SESSION_OWNER, SEND_REFUSALS); the client id and the
    active run it reads as _claims_statement does. tests/test_submit_fast_path.py holds it to
    the full path's decision case by case.

    None when it is not that case (not visible, the session or its project archived, a
    repeated client id, a run active, the guard failed), or when a concurrent submit won a
    constraint: the caller then takes the full path, which decides under the session's lock
    and answers every case. The statement needs no lock to be safe:
    `one_active_run_per_session` and the client-id constraint refuse whatever a concurrent
    decision would have made wrong.
    """
    run = Run(
        session_id=session_id,
        client_id=message.client_id,
        prompt_text=message.text,
        attachments=list(message.attachments),
        source=message.source,
        source_meta=dict(message.source_meta),
    )
    fields = _run_insert_fields()
    # The viewer's own sessions only, staff too (SessionQuerySet.visible_to, as the full path).
    check_owner = viewer is not None
    params: list[Any] = [session_id, *([viewer.pk] if check_owner else [])]
    params += [refusal.value for refusal in SEND_REFUSALS]
    params += [message.client_id, message.client_id, *ACTIVE_STATUSES]
    condition = ""
    if guard is not None:
        condition, guard_params = guard.sql()
        params += guard_params
    params += [field.get_db_prep_save(field.pre_save(run, add=True), connection) for field in fields]
    params += [notify.RUNNERS_CHANNEL, "run.queued:"]
    try:
        with connection.cursor() as cursor:
            cursor.execute(_new_turn_statement(check_owner, condition), params)
            row = cursor.fetchone()
    except IntegrityError:
        return None
    if row is None:
        return None
    run.pk = row[0]
    run._state.adding = False
    run._state.db = connection.alias
    return run


@lru_cache(maxsize=1)
def _run_insert_fields() -> list[Any]:
    return [field for field in Run._meta.concrete_fields if not field.primary_key]


# The one-statement path's alias for each model a Session lookup may pass through.
_STATEMENT_ALIASES: dict[type[Any], str] = {Session: "s", Project: "p"}


def _session_column(lookup: str) -> str:
    """A Session lookup ("status", "project__owner") as the statement's column ("p.owner_id")."""
    model: type[Any] = Session
    *relations, name = lookup.split("__")
    for relation in relations:
        model = model._meta.get_field(relation).related_model
    column = model._meta.get_field(name).column
    return f"{_STATEMENT_ALIASES[model]}.{connection.ops.quote_name(column)}"


@lru_cache(maxsize=8)
def _new_turn_statement(check_owner: bool, condition: str) -> str:
    quote = connection.ops.quote_name
    run, session, project, intent = (
        quote(model._meta.db_table) for model in (Run, Session, Project, PendingIntent)
    )
    columns = ", ".join(quote(field.column) for field in _run_insert_fields())
    values = ", ".join(["%s"] * len(_run_insert_fields()))
    active = ", ".join(["%s"] * len(ACTIVE_STATUSES))
    owner = f"AND {_session_column(SESSION_OWNER)} = %s " if check_owner else ""
    refused = "".join(f"AND {_session_column(refusal.lookup)} <> %s " for refusal in SEND_REFUSALS)
    return (
        f"WITH target AS (SELECT s.id FROM {session} s JOIN {project} p ON p.id = s.project_id "
        f"WHERE s.id = %s {owner}{refused}"
        f"AND NOT EXISTS (SELECT 1 FROM {intent} i WHERE i.session_id = s.id AND i.client_id = %s) "
        f"AND NOT EXISTS (SELECT 1 FROM {run} r WHERE r.session_id = s.id "
        f"AND (r.client_id = %s OR r.status IN ({active}))) "
        f"{'AND ' + condition + ' ' if condition else ''}"
        # Keeps the full path's decisions in order with this one: it waits for them.
        "FOR UPDATE OF s), "
        f"created AS (INSERT INTO {run} ({columns}) SELECT {values} FROM target "
        "RETURNING id, session_id, created_at), "
        f"touched AS (UPDATE {session} SET updated_at = created.created_at FROM created "
        f"WHERE {session}.id = created.session_id) "
        # The runners' doorbell (runs.notify.wake_runners), delivered at this commit.
        "SELECT id, pg_notify(%s, %s || id) FROM created"
    )


def do_launch_workflow(
    workflow: Workflow, *, session: Session | None, variables: dict[str, str], client_id: str
) -> SubmitResult:
    """Render the workflow's prompt and submit it as a turn (a new session when none is given).

    Raises KeyError (missing variables) or ValueError (bad template) before
    anything is written; Conflict `too_many_sessions` when a new session is past the owner's cap.
    """
    text = workflow.render(variables)
    meta = {"workflow_id": workflow.pk, "workflow_name": workflow.name, "variables": variables}
    with transaction.atomic():
        if session is None:
            session = Session.objects.filter(project=workflow.project, runs__client_id=client_id).first()
        if session is None:
            hold_session_room(workflow.project.owner_id)
            session = Session.objects.create(
                project=workflow.project,
                title=workflow.name,
                mode=workflow.agent_mode,
                model=workflow.agent_model,
            )
        message = NewMessage(client_id, text, "queue", source=RunSource.WORKFLOW, source_meta=meta)
        return _submit(session.pk, None, message)
