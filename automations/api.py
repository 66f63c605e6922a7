"""Triggers, firings and webhooks. Thin views: parse, authorize, act, serialise.

Design note: docs/automations.md. Every route but the webhook's is the owner's only (a 404 for
anyone else, as everywhere). `POST /hooks/{secret}` takes no session cookie and no token and
checks no CSRF: the secret in its path is the credential.
"""

from __future__ import annotations

from typing import Any

import orjson
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja import Query, Router, Status

from automations import services
from automations.models import SECRET_PREFIX, Firing, Trigger
from automations.schemas import (
    FiringFilter,
    FiringOut,
    HookOut,
    SecretOut,
    TriggerIn,
    TriggerOut,
    TriggerPatch,
    trigger_out,
)
from hermesweb import body_limit
from hermesweb.auth import get_visible
from hermesweb.errors import ApiError, ErrorOut, error_body, has_nul, not_found
from projects.models import Session, Workflow

router = Router()

# A webhook's body, at most (413 `request_too_large` past it): the server refuses a larger one
# before reading it (hermesweb.body_limit); this check holds under any other server too.
HOOK_MAX_BYTES = body_limit.HOOK_MAX_BYTES
# Longer than any secret we issue: not looked up.
_SECRET_MAX = 100


def hook_url(request: HttpRequest, secret: str) -> str:
    return request.build_absolute_uri(f"/api/hooks/{secret}")


# ---------------------------------------------------------------- triggers


@router.get("/workflows/{id}/triggers", response=list[TriggerOut], tags=["automations"])
def list_triggers(request: HttpRequest, id: int) -> list[TriggerOut]:
    workflow = get_visible(Workflow.objects, request.auth, id, "workflow")
    return [trigger_out(t) for t in workflow.triggers.all()]


@router.post("/workflows/{id}/triggers", response={201: TriggerOut}, tags=["automations"])
def create_trigger(request: HttpRequest, id: int, payload: TriggerIn) -> Status[TriggerOut]:
    """A schedule (`cron` + `timezone`, or `at`) or a webhook, whose `url` is in this answer only.

    422 `invalid_schedule` / `invalid_timezone` with the reason; `wrong_project` for a
    `session_id` of another project.
    """
    workflow = get_visible(Workflow.objects.select_related("project"), request.auth, id, "workflow")
    session = None
    if payload.session_id is not None:
        session = get_visible(Session.objects, request.auth, payload.session_id, "session")
    created = services.do_create_trigger(
        workflow,
        kind=payload.kind,
        cron=payload.cron or "",
        timezone_name=payload.timezone,
        at=payload.at,
        missed=payload.missed,
        overlap=payload.overlap,
        variables=payload.variables,
        session=session,
        enabled=payload.enabled,
        approval_timeout_seconds=payload.approval_timeout_seconds,
    )
    url = hook_url(request, created.secret) if created.secret else None
    return Status(201, trigger_out(created.trigger, url))


@router.get("/triggers/{id}", response=TriggerOut, tags=["automations"])
def get_trigger(request: HttpRequest, id: int) -> TriggerOut:
    return trigger_out(get_visible(Trigger.objects, request.auth, id, "trigger"))


@router.patch("/triggers/{id}", response=TriggerOut, tags=["automations"])
def update_trigger(request: HttpRequest, id: int, payload: TriggerPatch) -> TriggerOut:
    """`enabled`, the schedule, `missed`, `overlap`, `variables`; a new schedule or a re-enabled
    trigger plans from now. 422 `invalid_schedule` / `invalid_timezone` as on create."""
    trigger = get_visible(Trigger.objects, request.auth, id, "trigger")
    # Omitted and null leave a field as it is, but a null timeout clears it (wait for a person).
    changes: dict[str, Any] = {
        k: v
        for k, v in payload.model_dump(exclude_unset=True).items()
        if v is not None or k == "approval_timeout_seconds"
    }
    if "timezone" in changes:
        changes["timezone_name"] = changes.pop("timezone")
    return trigger_out(services.do_update_trigger(trigger, **changes))


@router.delete("/triggers/{id}", response={204: None}, tags=["automations"])
def delete_trigger(request: HttpRequest, id: int) -> Status[None]:
    """Delete a trigger and its firing history; the sessions and runs it launched stay."""
    services.do_delete_trigger(get_visible(Trigger.objects, request.auth, id, "trigger"))
    return Status(204, None)


@router.post("/triggers/{id}/secret", response=SecretOut, tags=["automations"])
def rotate_secret(request: HttpRequest, id: int) -> SecretOut:
    """A webhook's new URL, shown once; the old one answers 404 from now on. 422 `not_a_webhook`."""
    trigger = get_visible(Trigger.objects, request.auth, id, "trigger")
    return SecretOut(url=hook_url(request, services.do_rotate_secret(trigger)))


@router.get("/workflows/{id}/firings", response=list[FiringOut], tags=["automations"])
def list_firings(request: HttpRequest, id: int, filters: Query[FiringFilter]) -> QuerySet[Firing]:
    """The workflow's firings, newest planned time first: outcome, reason, session and run."""
    workflow = get_visible(Workflow.objects, request.auth, id, "workflow")
    firings = Firing.objects.of_workflow(workflow.pk)
    if filters.trigger_id is not None:
        # Another workflow's trigger is "not found", as its id would be anywhere else.
        if not workflow.triggers.filter(pk=filters.trigger_id).exists():
            raise not_found("trigger")
        firings = firings.filter(trigger_id=filters.trigger_id)
    return firings[: filters.limit]


# ---------------------------------------------------------------- webhooks


@router.post(
    "/hooks/{secret}",
    response={202: HookOut, 429: ErrorOut},
    auth=None,
    tags=["automations"],
)
def call_hook(request: HttpRequest, secret: str) -> Status[HookOut] | HttpResponse:
    """Fire a webhook trigger with a JSON object body (≤ 64 KiB) whose fields reach the prompt.

    No session cookie, no token, no CSRF: the secret is the credential. 404 for an unknown,
    rotated or disabled secret; 413 `request_too_large`; 429 `rate_limited` with Retry-After
    past the per-trigger rate; 422 (the firing recorded `failed`) when the workflow could not
    launch, e.g. `missing_variables`. 202 with `outcome` `skipped_overlap` while the trigger's
    last run is still active.
    """
    if len(request.body) > HOOK_MAX_BYTES:
        raise ApiError(
            413,
            "request_too_large",
            f"A webhook's body may be at most {HOOK_MAX_BYTES} bytes.",
            {"limit": HOOK_MAX_BYTES},
        )
    if not secret.startswith(SECRET_PREFIX) or len(secret) > _SECRET_MAX:
        raise not_found("webhook")
    if not Trigger.objects.for_secret(secret).enabled().exists():
        raise not_found("webhook")
    body = hook_body(request.body)
    try:
        firing = services.do_fire_webhook(secret, body)
    except Trigger.DoesNotExist:
        raise not_found("webhook") from None
    except services.RateLimited as exc:
        response = JsonResponse(
            error_body("rate_limited", str(exc), {"retry_after": exc.retry_after}), status=429
        )
        response["Retry-After"] = str(exc.retry_after)
        return response
    if firing.outcome == "failed":
        raise ApiError(422, services.failure_code(firing), firing.reason, {"firing_id": firing.pk})
    return Status(
        202,
        HookOut(
            firing_id=firing.pk,
            outcome=firing.outcome,
            session_id=firing.session_id,
            run_id=firing.run_id,
            intent_id=firing.intent_id,
        ),
    )


def hook_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object ({} when empty): 400 `invalid_json`, 422 for anything else."""
    if not raw.strip():
        return {}
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "invalid_json", f"The request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ApiError(422, "validation_error", "The request body must be a JSON object.")
    if has_nul(data):
        raise ApiError(422, "validation_error", "Strings must not contain the NUL character (\\u0000).")
    return data
