"""The WebSocket origin check: a socket opens only from the workbench's own origin.

A browser sends the session cookie with a WebSocket handshake from any page, so the Origin
is what tells our pages from another site's (or another port's: `http://localhost:3000` is
not `http://localhost:8000`). It must equal, in scheme, host and port, the request's own
origin (its Host, which must be an allowed host) or one of HERMESWEB_ALLOWED_ORIGINS.
"""

from __future__ import annotations

import logging
from typing import Any

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

from hermesweb.env import Origin, parse_origin

log = logging.getLogger("hermesweb.origins")


def _headers(scope: dict[str, Any], name: bytes) -> list[str]:
    return [value.decode("latin1") for key, value in scope.get("headers", []) if key == name]


def own_origin(scope: dict[str, Any]) -> Origin | None:
    """The origin the request was addressed to: its scheme and its Host, if that host is ours.

    The Host must pass ALLOWED_HOSTS as it does for HTTP, or a DNS-rebound page (Host and
    Origin both `evil.example:8000`) would count as same-origin. Behind a TLS proxy
    HERMESWEB_HTTPS says the public scheme; daphne does not put one in the scope.
    """
    hosts = _headers(scope, b"host")
    if len(hosts) != 1:
        return None
    domain, _port = split_domain_port(hosts[0])
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return None
    secure = settings.HERMESWEB_HTTPS or scope.get("scheme") in ("wss", "https")
    return parse_origin(f"{'https' if secure else 'http'}://{hosts[0]}")


def origin_allowed(scope: dict[str, Any]) -> bool:
    origins = _headers(scope, b"origin")
    if len(origins) != 1:
        return False  # no Origin at all is a non-browser client: it can send ours
    origin = parse_origin(origins[0])
    if origin is None:
        return False
    configured = settings.HERMESWEB_ALLOWED_ORIGINS
    if "*" in configured:  # settings allow this only with DEBUG on
        return True
    return origin == own_origin(scope) or origin in {parse_origin(o) for o in configured}


class SameOriginValidator:
    """ASGI middleware: refuse (403) a WebSocket handshake whose Origin is not ours."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and not origin_allowed(scope):
            log.warning(
                "refused a WebSocket from origin %r to host %r",
                _headers(scope, b"origin"),
                _headers(scope, b"host"),
            )
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
