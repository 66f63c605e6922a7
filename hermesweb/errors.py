"""One error shape for the whole API: `{code, message, details?}`.

Views raise `ApiError`; domain code raises its own coded exceptions, subclasses of
`projects.refusals.Refused` as `ApiError` is, and one handler answers them all. The handlers here
make sure nothing — a malformed body,
an oversized upload, a bug — ever reaches the client as Django's HTML error
page. Unexpected exceptions are logged with their traceback and answered with
a 500 `internal_error` that carries no internals.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.core.exceptions import (
    ObjectDoesNotExist,
    PermissionDenied,
    RequestDataTooBig,
    SuspiciousOperation,
)
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError, InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse
from ninja import Field, Schema
from ninja.errors import AuthenticationError, AuthorizationError, HttpError, Throttled, ValidationError

from intents.schemas import MAX_ID as MAX_ID  # the routers' and pages' id bound, kept here for them
from projects.refusals import Refused

if TYPE_CHECKING:
    from ninja import NinjaAPI

log = logging.getLogger("hermesweb.api")


class ApiError(Refused):
    """An answer the API gives on purpose: an HTTP status, a stable code, a safe message."""

    def body(self) -> dict[str, Any]:
        return error_body(self.code, self.message, self.details)


class ErrorOut(Schema):
    """The body of every 4xx and 5xx answer (the OpenAPI document declares it on each operation)."""

    code: str = Field(description="Stable and machine-readable: what went wrong, for a program to act on.")
    message: str = Field(description="What went wrong, for a person.")
    details: Any = Field(None, description="Where given: the fields at fault, a limit, the current state.")


# The error answers any operation may give, by what the operation takes (`error_responses`).
ANY_OPERATION = {
    401: "Not signed in, or the token is invalid or revoked (`not_authenticated`).",
    503: "The database cannot be reached (`database_unavailable`, with Retry-After).",
}
WITH_INPUT = {422: "A parameter or the body is invalid (`validation_error`, with `details`) or refused."}
WITH_PATH_ID = {404: "No such object, or not yours (`not_found`)."}
WITH_BODY = {
    400: "The body is not JSON (`invalid_json`) or was refused (`bad_request`).",
    413: "The body is larger than this route allows (`request_too_large`, `payload_too_large`).",
}
UNSAFE = {
    403: "A signed-in browser sent no CSRF token (`csrf_failed`), or the action is not allowed.",
    409: "The current state forbids the action (`conflict` or a more specific code).",
}


def error_responses(method: str, path: str, operation: dict[str, Any]) -> dict[int, str]:
    """The error statuses an operation may answer, each with what it means."""
    statuses = {**ANY_OPERATION}
    if operation.get("parameters") or operation.get("requestBody"):
        statuses.update(WITH_INPUT)
    if "{" in path:
        statuses.update(WITH_PATH_ID)
    if operation.get("requestBody"):
        statuses.update(WITH_BODY)
    if method.upper() not in ("GET", "HEAD", "OPTIONS"):
        statuses.update(UNSAFE)
    return statuses


def document_errors(schema: dict[str, Any]) -> dict[str, Any]:
    """Declare `ErrorOut` answers on every operation of an OpenAPI document, in place.

    Views raise coded errors rather than declaring them one by one; this keeps the document
    saying what they answer, for a new endpoint too. A status an operation declares itself stays.
    """
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["ErrorOut"] = ErrorOut.model_json_schema(ref_template="#/components/schemas/{model}")
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}
    for path, methods in schema.get("paths", {}).items():
        for method, operation in methods.items():
            responses = operation.setdefault("responses", {})
            declared = {str(status) for status in responses}
            for status, description in error_responses(method, path, operation).items():
                if str(status) not in declared:
                    responses[status] = {"description": description, "content": error}
    return schema


def has_nul(value: Any) -> bool:
    """Whether a decoded JSON value holds a NUL character in any string, keys included.

    PostgreSQL stores no NUL in text or jsonb: input that carries one is refused at the edge
    (the API's parser, the socket's frames) rather than failing as it is written.
    """
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(has_nul(key) or has_nul(item) for key, item in value.items())
    if isinstance(value, list):
        return any(has_nul(item) for item in value)
    return False


def error_body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message}
    if details is not None:
        body["details"] = details
    return body


# What a 503 for an unreachable database asks the client to wait before sending it again.
RETRY_AFTER_SECONDS = 2


def database_unavailable_body() -> dict[str, Any]:
    return error_body("database_unavailable", "The database cannot be reached right now; try again.")


def not_found(what: str = "object") -> ApiError:
    # The same answer whether the object is missing or belongs to someone else.
    return ApiError(404, "not_found", f"No such {what}.")


_STATUS_CODES = {
    400: "bad_request",
    401: "not_authenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    422: "validation_error",
    429: "throttled",
}


def validation_details(errors: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ninja's pydantic errors as `{field, location, message, type}`.

    Ninja reports body fields as `("body", <parameter name>, field, …)`; the
    parameter name is an implementation detail, so it is dropped.
    """
    details = []
    for error in errors:
        loc = [str(part) for part in error.get("loc", ())]
        location = loc[0] if loc else "body"
        rest = loc[2:] if location == "body" else loc[1:]
        details.append(
            {
                "field": ".".join(rest) or location,
                "location": location,
                "message": str(error.get("msg", "invalid")),
                "type": str(error.get("type", "invalid")),
            }
        )
    return details


def install_exception_handlers(api: NinjaAPI) -> None:
    def respond(request: HttpRequest, status: int, body: dict[str, Any]) -> HttpResponse:
        return api.create_response(request, body, status=status)

    @api.exception_handler(Refused)
    def on_refused(request: HttpRequest, exc: Refused) -> HttpResponse:
        # Every refusal, the views' ApiError and the domain's own alike: one shape, its own status.
        return respond(request, exc.status, error_body(exc.code, exc.message, exc.details))

    @api.exception_handler(ValidationError)
    def on_validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
        details = validation_details(exc.errors)
        fields = ", ".join(d["field"] for d in details)
        return respond(request, 422, error_body("validation_error", f"Invalid input: {fields}.", details))

    @api.exception_handler(DjangoValidationError)
    def on_model_validation_error(request: HttpRequest, exc: DjangoValidationError) -> HttpResponse:
        if hasattr(exc, "error_dict"):
            details = [
                {"field": field, "location": "body", "message": " ".join(messages), "type": "invalid"}
                for field, messages in exc.message_dict.items()
            ]
        else:
            details = [
                {"field": "body", "location": "body", "message": m, "type": "invalid"} for m in exc.messages
            ]
        return respond(request, 422, error_body("validation_error", "Invalid input.", details))

    @api.exception_handler(AuthenticationError)
    def on_authentication_error(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
        return respond(
            request,
            401,
            error_body("not_authenticated", "Sign in, or send 'Authorization: Bearer <token>'."),
        )

    @api.exception_handler(AuthorizationError)
    def on_authorization_error(request: HttpRequest, exc: AuthorizationError) -> HttpResponse:
        return respond(request, 403, error_body("forbidden", str(exc)))

    @api.exception_handler(Throttled)
    def on_throttled(request: HttpRequest, exc: Throttled) -> HttpResponse:
        return respond(request, 429, error_body("throttled", str(exc)))

    @api.exception_handler(HttpError)
    def on_http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
        if isinstance(exc.__cause__, Refused):
            # The parser refused the body on purpose (ninja wraps whatever it raises in a 400).
            return on_refused(request, exc.__cause__)
        code = _STATUS_CODES.get(exc.status_code, "error")
        message = str(exc)
        if exc.status_code == 400 and exc.__cause__ is not None:
            # Ninja wraps the parser's exception; its text says what is wrong and is safe to show.
            code, message = "invalid_json", f"The request body is not valid JSON: {exc.__cause__}"
        return respond(request, exc.status_code, error_body(code, message))

    @api.exception_handler(Http404)
    def on_http404(request: HttpRequest, exc: Http404) -> HttpResponse:
        return respond(request, 404, error_body("not_found", "Not found."))

    @api.exception_handler(ObjectDoesNotExist)
    def on_does_not_exist(request: HttpRequest, exc: ObjectDoesNotExist) -> HttpResponse:
        return respond(request, 404, error_body("not_found", "Not found."))

    @api.exception_handler(PermissionDenied)
    def on_permission_denied(request: HttpRequest, exc: PermissionDenied) -> HttpResponse:
        return respond(request, 403, error_body("forbidden", "Permission denied."))

    @api.exception_handler(RequestDataTooBig)
    def on_too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
        return respond(request, 413, error_body("payload_too_large", "The request body is too large."))

    @api.exception_handler(SuspiciousOperation)
    def on_suspicious(request: HttpRequest, exc: SuspiciousOperation) -> HttpResponse:
        log.warning("suspicious request to %s: %s", request.path, exc)
        return respond(request, 400, error_body("bad_request", "The request was refused."))

    @api.exception_handler(IntegrityError)
    def on_integrity_error(request: HttpRequest, exc: IntegrityError) -> HttpResponse:
        # A constraint caught a race the action did not anticipate: the client may
        # retry, but the traceback is kept because the action should handle it.
        log.warning("integrity error on %s %s", request.method, request.path, exc_info=exc)
        return respond(request, 409, error_body("conflict", "The request conflicts with the current state."))

    @api.exception_handler(OperationalError)
    @api.exception_handler(InterfaceError)
    def on_database_unavailable(request: HttpRequest, exc: Exception) -> HttpResponse:
        # A restart, a failover, a pool that could not connect. Whether a write landed may be
        # unknown; sending the same request again is safe (a submit's client id dedupes it).
        log.warning("database unavailable for %s %s: %s", request.method, request.path, exc)
        response = respond(request, 503, database_unavailable_body())
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response

    @api.exception_handler(Exception)
    def on_unexpected(request: HttpRequest, exc: Exception) -> HttpResponse:
        log.error("unhandled error on %s %s", request.method, request.path, exc_info=exc)
        return respond(request, 500, error_body("internal_error", "Internal error; it has been logged."))
