"""Django's stock middleware, declared synchronous.

Under ASGI Django awaits each async-capable middleware, and the stock classes get
that from MiddlewareMixin by running every `process_request` and `process_response`
through `sync_to_async`: a thread hop for each (twelve per request with this list),
most of a small request's time. Declared sync-only, Django adapts the whole chain once:
one hop to a thread, where the middleware and the (synchronous) views run back to back.
"""

from __future__ import annotations

from typing import Any

from axes import middleware as axes
from django.contrib.auth import middleware as auth
from django.contrib.messages import middleware as messages
from django.contrib.sessions import middleware as sessions
from django.middleware import clickjacking, common, csrf, security


def _sync_only(cls: type[Any]) -> type[Any]:
    return type(cls.__name__, (cls,), {"async_capable": False, "sync_capable": True, "__module__": __name__})


SecurityMiddleware = _sync_only(security.SecurityMiddleware)
SessionMiddleware = _sync_only(sessions.SessionMiddleware)
CommonMiddleware = _sync_only(common.CommonMiddleware)
CsrfViewMiddleware = _sync_only(csrf.CsrfViewMiddleware)
AuthenticationMiddleware = _sync_only(auth.AuthenticationMiddleware)
MessageMiddleware = _sync_only(messages.MessageMiddleware)
XFrameOptionsMiddleware = _sync_only(clickjacking.XFrameOptionsMiddleware)
# Turns a sign-in django-axes refused into its 429 lockout page (settings: AXES_*).
AxesMiddleware = _sync_only(axes.AxesMiddleware)


class AdminContentSecurityPolicy:
    """The pages' Content-Security-Policy (hermesweb/views.py) on the admin's answers too.

    The admin's templates carry no inline script or style (Django 6 made them CSP-clean), so the
    same policy holds there: a script injected into a row the admin shows does not run.
    """

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Any) -> None:
        from hermesweb.views import CONTENT_SECURITY_POLICY

        self.get_response = get_response
        self.policy = CONTENT_SECURITY_POLICY
        self.prefix: str | None = None

    def __call__(self, request: Any) -> Any:
        response = self.get_response(request)
        if self.prefix is None:
            from django.urls import reverse

            self.prefix = reverse("admin:index")
        if request.path.startswith(self.prefix):
            response.headers.setdefault("Content-Security-Policy", self.policy)
        return response
