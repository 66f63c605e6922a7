"""API authentication: a personal token, or the browser's Django session.

A request that carries `Authorization: Bearer …` is judged by the token alone:
a wrong or revoked token is a 401 even when a session cookie rides along, so a
script never silently acts as whoever is signed in to the browser. Session
callers get Django's CSRF check on unsafe methods; token callers need none,
because a browser never attaches the header on its own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import lru_cache, partial, wraps
from importlib import import_module
from types import SimpleNamespace
from typing import Any

from axes.attempts import get_cool_off_threshold
from axes.backends import AxesStandaloneBackend
from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_failure_limit
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth import (
    BACKEND_SESSION_KEY,
    HASH_SESSION_KEY,
    SESSION_KEY,
    get_user_model,
    load_backend,
)
from django.contrib.auth import get_user as auth_get_user
from django.contrib.auth.models import AnonymousUser
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import Sum
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.utils.crypto import constant_time_compare
from django.utils.functional import SimpleLazyObject
from ninja.security import APIKeyCookie, HttpBearer
from ninja.utils import check_csrf

from hermesweb.errors import MAX_ID, ApiError, error_body, not_found
from hermesweb.models import ApiToken


class LoginThrottleBackend(AxesStandaloneBackend):
    """django-axes' lockout check (docs/security.md), for sign-ins that come over HTTP.

    `authenticate()` without a request comes from code the operator runs (a shell, the test
    client's `login()`), not from a guesser on the network: axes would refuse it outright.
    """

    def authenticate(  # type: ignore[override]
        self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kw: Any
    ) -> None:
        if request is None:
            return None
        return super().authenticate(request, username, password, **kw)


class LoginThrottleHandler(AxesDatabaseHandler):
    """axes' database handler with a second, much higher threshold per address (docs/security.md).

    axes' lockout parameter is one username at one address (AXES_FAILURE_LIMIT): a guesser
    inventing names no longer locks out the real users behind its address (every local process
    shares 127.0.0.1). All failures from one address, whatever the names, still lock that
    address at HERMESWEB_LOGIN_ADDRESS_FAILURE_LIMIT. A success clears only its own username's
    count there, so an account of one's own does not reset the address's.
    """

    def get_failures(self, request: HttpRequest, credentials: dict[str, Any] | None = None) -> int:
        failures = super().get_failures(request, credentials)
        limit = get_failure_limit(request, credentials)
        if failures >= limit:
            return failures
        attempts = AccessAttempt.objects.filter(ip_address=request.axes_ip_address)  # type: ignore[attr-defined]
        if settings.AXES_COOLOFF_TIME is not None:
            attempts = attempts.filter(attempt_time__gte=get_cool_off_threshold(request))
        from_address = attempts.aggregate(total=Sum("failures_since_start"))["total"] or 0
        # axes compares this one number with its one limit, at the sign-in and after a failure.
        return limit if from_address >= settings.HERMESWEB_LOGIN_ADDRESS_FAILURE_LIMIT else failures


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
# Beyond this a value cannot be one of our tokens; skip hashing junk.
_MAX_TOKEN_LENGTH = 200


def bearer_value(request: HttpRequest) -> str | None:
    """The token of an `Authorization: Bearer` header, "" for an empty one, None without one."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip()


def user_for_token(raw: str) -> Any | None:
    if not raw or len(raw) > _MAX_TOKEN_LENGTH:
        return None
    return ApiToken.user_for(raw)


class BearerTokenAuth(HttpBearer):
    def __call__(self, request: HttpRequest) -> Any | None:
        raw = bearer_value(request)
        if raw is None:
            return None
        return self.authenticate(request, raw)

    def authenticate(self, request: HttpRequest, token: str) -> Any | None:
        user = user_for_token(token)
        if user is None:
            raise ApiError(401, "not_authenticated", "The API token is invalid or revoked.")
        # Code below the API reads request.user like any Django view.
        request.user = user
        request._hermesweb_token_auth = True  # type: ignore[attr-defined]
        return user


class SessionCsrfAuth(APIKeyCookie):
    """The Django session, with CSRF enforced for unsafe methods.

    Ninja's stock SessionAuth checks CSRF before it knows who is calling, which
    turns an anonymous POST into a 403; here an anonymous caller is a 401.
    """

    param_name = settings.SESSION_COOKIE_NAME

    def _get_key(self, request: HttpRequest) -> str | None:
        return request.COOKIES.get(self.param_name)

    def authenticate(self, request: HttpRequest, key: str | None) -> Any | None:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None
        if request.method not in SAFE_METHODS and check_csrf(request) is not None:
            raise ApiError(
                403,
                "csrf_failed",
                "CSRF check failed: send the csrftoken cookie's value in the X-CSRFToken header.",
            )
        return user


def api_auth() -> list[Any]:
    return [BearerTokenAuth(), SessionCsrfAuth()]


def authenticated_user(request: HttpRequest) -> Any | None:
    """The caller for plain Django views (the OpenAPI docs): token first, then session."""
    raw = bearer_value(request)
    if raw is not None:
        return user_for_token(raw)
    user = getattr(request, "user", None)
    return user if user is not None and user.is_authenticated else None


def login_required_json(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Like login_required, but a 401 in the API's error shape instead of a redirect."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if authenticated_user(request) is None:
            return JsonResponse(
                error_body("not_authenticated", "Sign in, or send 'Authorization: Bearer <token>'."),
                status=401,
            )
        return view(request, *args, **kwargs)

    return wrapper


def get_visible(queryset: Any, user: Any, pk: int, what: str) -> Any:
    """The object with `pk` among those `user` may see, or a 404 `not_found`.

    Someone else's object and a missing one get the same answer, so ids leak
    nothing. An id no bigint can hold is simply absent (SQLite would raise).
    """
    if not 1 <= pk <= MAX_ID:
        raise not_found(what)
    obj = queryset.visible_to(user).filter(pk=pk).first()
    if obj is None:
        raise not_found(what)
    return obj


def socket_user_now(scope: dict[str, Any]) -> Any | None:
    """The socket's user as its session says now; None once that is no longer so.

    A socket reads its session once, as it connects; writing through it (a submit) asks
    again, as an HTTP request would: signed out, expired, deactivated, or a password changed
    elsewhere, and the socket no longer writes.
    """
    connected = _connected(scope)
    if connected is None:
        return None
    guard = socket_sign_in(scope)
    if guard is not None:
        return connected if guard.holds() else None
    fresh = import_module(settings.SESSION_ENGINE).SessionStore(scope["session"].session_key)
    user = auth_get_user(SimpleNamespace(session=fresh))  # type: ignore[arg-type]
    return user if user.is_authenticated and user.pk == connected.pk else None


def _connected(scope: dict[str, Any]) -> Any | None:
    user, session = scope.get("user"), scope.get("session")
    if user is None or not user.is_authenticated or session is None or not session.session_key:
        return None
    return user


_DB_SESSIONS = "django.contrib.sessions.backends.db"
_MODEL_BACKEND = "django.contrib.auth.backends.ModelBackend"


@dataclass(frozen=True)
class StillSignedIn:
    """A socket's sign-in as an SQL condition: true while it stands, as Django's get_user judges.

    The handshake verified it with get_user (the session names the user through the model
    backend, with the hash of the password the user had then). While the session's row is
    there and unexpired, and the user is active with that same password hash, get_user would
    say the same again: Django never moves a session key to another user (signing in cycles
    the key), signing out deletes the row, and a new password changes the hash. As SQL the
    check rides in the statement that writes (runs.services' guard), so a submit over the
    socket needs no read of its own; tests/test_live_auth.py holds it to get_user's answers.
    """

    session_key: str
    user_id: Any
    password: str
    is_staff: bool  # as it was: what the socket may see and write to depends on it

    def sql(self) -> tuple[str, list[Any]]:
        params = [self.user_id, self.session_key, timezone.now(), self.password, self.is_staff]
        return _still_signed_in_sql(), params

    def holds(self) -> bool:
        condition, params = self.sql()
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {condition}", params)
            row = cursor.fetchone()
        return bool(row and row[0])


def still_signed_in(guards: Collection[StillSignedIn]) -> set[StillSignedIn]:
    """The guards that hold now, in two queries per chunk: what StillSignedIn.holds() says of each.

    For the sockets' periodic re-check (runs.live.signins): one statement per guard per few
    seconds would grow with the sockets, and run on the thread the fan-out's reads use.
    """
    from django.contrib.sessions.models import Session as DjangoSession

    holding: set[StillSignedIn] = set()
    ordered = list(guards)
    for start in range(0, len(ordered), 500):  # under SQLite's bound on parameters
        chunk = ordered[start : start + 500]
        live = set(
            DjangoSession.objects.filter(
                session_key__in={g.session_key for g in chunk}, expire_date__gt=timezone.now()
            ).values_list("session_key", flat=True)
        )
        users = {
            pk: (password, is_staff)
            for pk, password, is_staff in get_user_model()
            .objects.filter(pk__in={g.user_id for g in chunk}, is_active=True)
            .values_list("pk", "password", "is_staff")
        }
        holding.update(
            g for g in chunk if g.session_key in live and users.get(g.user_id) == (g.password, g.is_staff)
        )
    return holding


def session_tag(session_key: str) -> str:
    """A session named without its key: the sign-out doorbell travels through Redis."""
    return hashlib.sha256(session_key.encode()).hexdigest()[:32]


def sign_in_facts(scope: dict[str, Any]) -> StillSignedIn | None:
    """StillSignedIn for a signed-in socket whenever sessions are Django's database ones.

    Unlike socket_sign_in, whatever the backends list: a session's user was loaded by a
    backend that, like ModelBackend, refuses an inactive user and one whose password hash changed.
    """
    connected = _connected(scope)
    if connected is None or settings.SESSION_ENGINE != _DB_SESSIONS:
        return None
    return StillSignedIn(scope["session"].session_key, connected.pk, connected.password, connected.is_staff)


def socket_sign_in(scope: dict[str, Any]) -> StillSignedIn | None:
    """StillSignedIn for a signed-in socket, with Django's database sessions and model backend.

    None otherwise: another session engine or backend is asked through get_user.
    """
    connected = _connected(scope)
    if connected is None:
        return None
    # The session names the backend get_user would ask; the login throttle authenticates no one.
    backend = scope["session"].get(BACKEND_SESSION_KEY)
    if settings.SESSION_ENGINE != _DB_SESSIONS or backend != _MODEL_BACKEND:
        return None
    if _MODEL_BACKEND not in settings.AUTHENTICATION_BACKENDS:
        return None
    return StillSignedIn(scope["session"].session_key, connected.pk, connected.password, connected.is_staff)


@lru_cache(maxsize=1)
def _still_signed_in_sql() -> str:
    from django.contrib.sessions.models import Session as DjangoSession

    quote = connection.ops.quote_name
    user_model = get_user_model()
    sessions, users = quote(DjangoSession._meta.db_table), quote(user_model._meta.db_table)
    return (
        f"EXISTS (SELECT 1 FROM {sessions} ds JOIN {users} du ON du.{quote(user_model._meta.pk.column)} = %s "
        "WHERE ds.session_key = %s AND ds.expire_date > %s AND du.password = %s AND du.is_active "
        "AND du.is_staff = %s)"
    )


class SocketSessionMiddleware:
    """`scope["session"]` and a lazy `scope["user"]` for a WebSocket; nothing is read here.

    The consumer accepts the handshake first and then reads both, once, in the event loop's
    thread pool (`read_socket_user`): read here, before the accept, 200 sockets reconnecting
    at once queued their reads past daphne's handshake timeout (docs/reliability.md, gap 8).
    Until that read the socket is sent nothing and its frames wait (Channels hands a consumer
    its messages one at a time). Channels' SessionMiddleware is not used: it wraps every frame
    to save a session a socket never changes. Sits under Channels' CookieMiddleware.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.store = import_module(settings.SESSION_ENGINE).SessionStore

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        session = self.store(scope["cookies"].get(settings.SESSION_COOKIE_NAME))
        # In place: CookieMiddleware made this dict for us alone, and a copy would be held, like
        # every frame of this stack, for as long as the socket is open.
        scope["session"] = session
        # Lazy, like Channels' AuthMiddleware's: evaluated in the event loop it raises
        # SynchronousOnlyOperation rather than block every socket on a query.
        scope["user"] = SimpleLazyObject(partial(session_user, session))
        return await self.inner(scope, receive, send)


def session_user(session: Any) -> Any:
    """The session's user, as Channels' get_user reads it; AnonymousUser for no, or a stale, session.

    Sync (two queries: the session's row, the user's). A session whose password hash no longer
    matches is flushed, as Django and Channels do; unlike Django's get_user it is never cycled
    to a new key (SECRET_KEY_FALLBACKS): a socket cannot hand the browser a new cookie.
    """
    user = None
    try:
        user_id = get_user_model()._meta.pk.to_python(session[SESSION_KEY])
        backend_path = session[BACKEND_SESSION_KEY]
    except (KeyError, ValidationError):
        pass
    else:
        if backend_path in settings.AUTHENTICATION_BACKENDS:
            user = load_backend(backend_path).get_user(user_id)
            if hasattr(user, "get_session_auth_hash"):
                session_hash = session.get(HASH_SESSION_KEY)
                if not (session_hash and constant_time_compare(session_hash, user.get_session_auth_hash())):
                    session.flush()
                    user = None
    return user or AnonymousUser()


def read_socket_user(scope: dict[str, Any]) -> Any:
    """The socket's user, read now and kept in the scope (sync: call it in the thread pool, once)."""
    user = scope.get("user")
    if isinstance(user, SimpleLazyObject):
        # The concrete object, so later reads of scope["user"] in the event loop cost nothing.
        user = session_user(scope["session"]) if scope.get("session") is not None else AnonymousUser()
    elif user is None:
        user = AnonymousUser()
    scope["user"] = user
    return user


# ---------------------------------------------------------------- sign-ins ending: the sockets' doorbell
# Wired in hermesweb.apps. The sockets close with 4401 within seconds of these (runs.live.signins);
# their periodic re-check catches what no signal sees (QuerySet.update, expiry, a lost doorbell).

_SIGN_IN_FIELDS = "_hermesweb_sign_in"


def _sign_in_fields(user: Any) -> tuple[Any, ...]:
    # From __dict__: a deferred field must not cost a query per user loaded.
    fields = user.__dict__
    return (fields.get("password"), fields.get("is_active"), fields.get("is_staff"))


def remember_sign_in_fields(sender: Any, instance: Any, **kwargs: Any) -> None:
    instance.__dict__[_SIGN_IN_FIELDS] = _sign_in_fields(instance)


def _ring(user_id: Any, tag: str | None) -> None:
    from runs import notify

    notify.publish_on_commit(notify.publish_sign_in_changed, user_id, tag)


def on_user_saved(
    sender: Any, instance: Any, created: bool, update_fields: Any = None, **kwargs: Any
) -> None:
    """A password, activity or staff flag changed: that user's sockets check their sign-in now."""
    before = instance.__dict__.get(_SIGN_IN_FIELDS)
    now = _sign_in_fields(instance)
    instance.__dict__[_SIGN_IN_FIELDS] = now
    if created or before == now:
        return
    if (
        before is None
        and update_fields is not None
        and not {"password", "is_active", "is_staff"} & set(update_fields)
    ):
        return
    _ring(instance.pk, None)


def on_user_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    _ring(instance.pk, None)


def on_logged_out(sender: Any, request: Any, user: Any, **kwargs: Any) -> None:
    """Logout: the sockets of this Django session close (sent before Django flushes it)."""
    key = getattr(getattr(request, "session", None), "session_key", None)
    if user is not None and key:
        _ring(user.pk, session_tag(key))
