"""ASGI entry: HTTP through Django, WebSockets under /ws/ through Channels (docs/live-delivery.md)."""

import gc
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hermesweb.settings")
# Django must be set up before anything imports models (the consumers do).
django.setup(set_prefix=False)

from hermesweb.access_log import route_daphne_access_log  # noqa: E402
from hermesweb.body_limit import BodyLimit, guard_daphne  # noqa: E402
from hermesweb.handlers import OneHopASGIHandler  # noqa: E402
from hermesweb.line_limit import guard_daphne_lines  # noqa: E402

django_asgi_app = OneHopASGIHandler()
# Bodies over the route's allowance are refused before they are read or spooled (docs/security.md).
guard_daphne()
# daphne's access log goes through LOGGING's redaction like any line (docs/security.md, "Redaction").
route_daphne_access_log()
# An over-long URL or header line is answered 414/431, not dropped without a word.
guard_daphne_lines()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.sessions import CookieMiddleware  # noqa: E402

from hermesweb.auth import SocketSessionMiddleware  # noqa: E402
from hermesweb.origins import SameOriginValidator  # noqa: E402
from hermesweb.static_assets import StaticFiles, warm  # noqa: E402
from runs.live.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        # CSS and modules from memory, before any middleware (docs/ui.md, "Loading").
        "http": StaticFiles(BodyLimit(django_asgi_app)),
        # The origin check (scheme, host and port) stops another site's page, or another port's,
        # from riding the user's session cookie.
        "websocket": SameOriginValidator(
            CookieMiddleware(SocketSessionMiddleware(URLRouter(websocket_urlpatterns)))
        ),
    }
)
warm()
# What is loaded by now lives as long as the process: kept out of the collector's full passes,
# which otherwise walk all of it (~100k objects, tens of ms) in the middle of live delivery.
gc.freeze()
