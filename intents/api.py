"""Pending intents: list, edit, withdraw, upgrade to steer, stop-and-send (docs/intents.md).

Results other than a version conflict are answers (200 with a status); a
conflict is a 409 carrying the intent as it is now, so the client can redraw
it and let the user retry.
"""

from __future__ import annotations

from typing import Annotated

from django.http import HttpRequest
from ninja import Body, Query, Router

from hermesweb.auth import get_visible
from hermesweb.errors import MAX_ID, ApiError
from intents import services
from intents.models import PendingIntent
from intents.previews import open_previews, previews
from intents.schemas import (
    MAX_INT,
    IntentActionIn,
    IntentDeleteIn,
    IntentOut,
    IntentPageOut,
    IntentPatch,
    IntentResultOut,
)
from projects.models import Session
from runs import controls

router = Router(tags=["intents"])


def result_out(result: services.IntentResult) -> IntentResultOut:
    intent = IntentOut.model_validate(result.intent)
    if result.status == "conflict":
        raise ApiError(409, "conflict", result.message, {"intent": intent.model_dump(mode="json")})
    return IntentResultOut(status=result.status, message=result.message, intent=intent)


# A page of the session's whole intent history (include_closed): settled intents pile up without
# bound, while the open queue is capped at submit (HERMESWEB_MAX_QUEUED_INTENTS) and comes whole.
INTENTS_PAGE = 100
INTENTS_PAGE_MAX = 500


@router.get("/sessions/{id}/intents", response=IntentPageOut)
def list_intents(
    request: HttpRequest,
    id: int,
    include_closed: bool = False,
    after: Annotated[
        int | None, Query(ge=0, le=MAX_ID, description="With `include_closed`: only intents after this id.")
    ] = None,
    limit: Annotated[
        int | None,
        Query(
            ge=1,
            le=INTENTS_PAGE_MAX,
            description=f"With `include_closed`: page size (default {INTENTS_PAGE}).",
        ),
    ] = None,
) -> IntentPageOut:
    """The session's open intents, the whole queue in queue order (`has_more` false).

    `?include_closed=true` lists every intent, the settled ones too, oldest first (by id), a page
    at a time: `limit` of them (default 100, at most 500) after the id `after`; `has_more` says
    more follow (ask again with `after=<after>`). 422 `validation_error` for a `limit` or `after`
    out of range; 422 `include_closed_required` for `after` or `limit` on the open queue, which
    is never paged. Each text is a preview, as in the socket's snapshot: the browser re-reads
    the list after every submit and action, and a queue of long messages would go out whole each time.
    """
    session = get_visible(Session.objects, request.auth, id, "session")
    if not include_closed:
        if after is not None or limit is not None:
            raise ApiError(
                422,
                "include_closed_required",
                "`after` and `limit` page only the `include_closed=true` list.",
            )
        return IntentPageOut(intents=open_previews(session), has_more=False, after=None)
    limit = limit or INTENTS_PAGE
    # One more than the page says whether another page follows.
    page = list(PendingIntent.objects.filter(session=session, pk__gt=after or 0).order_by("pk")[: limit + 1])
    has_more = len(page) > limit
    page = page[:limit]
    return IntentPageOut(intents=previews(page), has_more=has_more, after=page[-1].pk if has_more else None)


@router.get("/intents/{id}", response=IntentOut)
def get_intent(request: HttpRequest, id: int) -> PendingIntent:
    """One intent with its whole text (what the browser loads to edit a long one)."""
    return get_visible(PendingIntent.objects, request.auth, id, "intent")


@router.patch("/intents/{id}", response=IntentResultOut)
def edit_intent(request: HttpRequest, id: int, payload: IntentPatch) -> IntentResultOut:
    """Edit the text and/or position of a waiting item. 409 `conflict` when `version` is stale."""
    intent = get_visible(PendingIntent.objects, request.auth, id, "intent")
    return result_out(
        services.do_edit_intent(intent, version=payload.version, text=payload.text, position=payload.position)
    )


@router.delete("/intents/{id}", response=IntentResultOut)
def delete_intent(
    request: HttpRequest,
    id: int,
    version: Annotated[int | None, Query(ge=1, le=MAX_INT)] = None,
    payload: Annotated[IntentDeleteIn | None, Body()] = None,
) -> IntentResultOut:
    """Withdraw a waiting item. `version` (query or body) guards against deleting an edited item."""
    intent = get_visible(PendingIntent.objects, request.auth, id, "intent")
    if version is None and payload is not None:
        version = payload.version
    return result_out(services.do_delete_intent(intent, version=version))


@router.post("/intents/{id}/steer", response=IntentResultOut)
def steer_intent(
    request: HttpRequest, id: int, payload: Annotated[IntentActionIn | None, Body()] = None
) -> IntentResultOut:
    """Deliver a waiting item to the active run as guidance; 409 `conflict` when the run cannot take it."""
    intent = get_visible(PendingIntent.objects, request.auth, id, "intent")
    return result_out(services.do_steer_intent(intent, run_id=payload.run_id if payload else None))


@router.post("/intents/{id}/stop-and-send", response=IntentResultOut)
def stop_and_send(
    request: HttpRequest, id: int, payload: Annotated[IntentActionIn | None, Body()] = None
) -> IntentResultOut:
    """Cancel the active run and send this item as the next turn."""
    intent = get_visible(PendingIntent.objects, request.auth, id, "intent")
    return result_out(controls.do_stop_and_send(intent, run_id=payload.run_id if payload else None))
