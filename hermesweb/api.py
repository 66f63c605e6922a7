"""The control API root: authentication, error shapes, the app routers, health.

Contract: issue 2 ("Control API"); OpenAPI at /api/docs. Every answer is JSON,
errors included (hermesweb/errors.py); every endpoint needs a signed-in user
or a personal token.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

import orjson
from django.conf import settings
from django.db import connection
from django.http import HttpRequest
from django.utils import timezone
from ninja import Field, NinjaAPI, Router, Schema, Status
from ninja.openapi.schema import OpenAPISchema
from ninja.parser import Parser
from ninja.renderers import BaseRenderer
from ninja.responses import NinjaJSONEncoder

from hermesweb.auth import api_auth, login_required_json
from hermesweb.errors import ApiError, document_errors, has_nul, install_exception_handlers, not_found
from runs.placement import PlacementHealth, placement_health

log = logging.getLogger(__name__)


class NulCharacter(ValueError):
    """PostgreSQL stores no NUL in text or jsonb; refusing it here keeps it from becoming a 500."""


class ORJSONParser(Parser):
    def parse_body(self, request: HttpRequest) -> Any:
        if not request.body.strip():
            return None  # no body: optional bodies stay unset; required ones fail validation
        if request.content_type in ("multipart/form-data", "application/x-www-form-urlencoded") and not (
            request.POST or request.FILES
        ):
            return None  # an empty form post (a bodiless client call) is no body, not bad JSON
        data = orjson.loads(request.body)
        if data is not None and not isinstance(data, dict):
            # Ninja would read a scalar as an object without fields: `false` made a session.
            # (`null` stays "no body", which an optional body may be.)
            raise ApiError(
                422,
                "validation_error",
                "The request body must be a JSON object.",
                [
                    {
                        "field": "body",
                        "location": "body",
                        "message": "must be a JSON object",
                        "type": "model_type",
                    }
                ],
            )
        if has_nul(data):
            raise NulCharacter("strings must not contain the NUL character (\\u0000)")
        return data


class ORJSONRenderer(BaseRenderer):
    media_type = "application/json"

    def render(self, request: HttpRequest, data: Any, *, response_status: int) -> bytes:
        # Materialized state may key a map by an id the agent left out (None).
        return orjson.dumps(data, default=NinjaJSONEncoder().default, option=orjson.OPT_NON_STR_KEYS)


class HermeswebAPI(NinjaAPI):
    def get_openapi_schema(
        self, *, path_prefix: str | None = None, path_params: dict[str, Any] | None = None
    ) -> OpenAPISchema:
        # Every operation's coded errors are part of its contract (hermesweb/errors.py).
        schema = super().get_openapi_schema(path_prefix=path_prefix, path_params=path_params)
        document_errors(schema)
        return schema


api = HermeswebAPI(
    title="hermesweb",
    version="1",
    description="Control API of the hermesweb workbench: projects, sessions, runs, journal, controls.",
    auth=api_auth(),
    renderer=ORJSONRenderer(),
    parser=ORJSONParser(),
    docs_decorator=login_required_json,
)
# Domain refusals (projects.refusals.Refused) map to HTTP there, once, not in every endpoint.
install_exception_handlers(api)


api.add_router("", "projects.api.router")
api.add_router("", "runs.api.router")
api.add_router("", "intents.api.router")
api.add_router("", "workspace.api.router")
api.add_router("", "automations.api.router")
api.add_router("", "worktrees.api.router")
api.add_router("", "hermesweb.tokens.router")


# ---------------------------------------------------------------- health


class DatabaseHealth(Schema):
    ok: bool
    vendor: str
    error: str | None = None


class ChannelLayerHealth(Schema):
    ok: bool
    backend: str
    redis: bool
    error: str | None = None


class RunnerHealth(Schema):
    id: str
    host: str
    pid: int
    started_at: datetime
    last_heartbeat: datetime
    alive: bool


class SandboxHealth(Schema):
    """The agent sandbox (docs/security.md): warnings only; an unsandboxed agent still works."""

    ok: bool
    bwrap: str | None
    warnings: list[str]


class DataDirHealth(Schema):
    """The data directory and what lies directly in it, owner-only (docs/security.md): warnings only."""

    ok: bool
    warnings: list[str]


class HealthOut(Schema):
    ok: bool
    database: DatabaseHealth
    channel_layer: ChannelLayerHealth
    runners: list[RunnerHealth]
    sandbox: SandboxHealth
    data_dir: DataDirHealth
    placement: PlacementHealth | None = Field(None, description="Projects no live runner can serve.")


def _database_health() -> DatabaseHealth:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:
        log.warning("health: database check failed", exc_info=True)
        return DatabaseHealth(ok=False, vendor=connection.vendor, error=type(exc).__name__)
    return DatabaseHealth(ok=True, vendor=connection.vendor)


def _channel_layer_health() -> ChannelLayerHealth:
    backend = settings.CHANNEL_LAYERS.get("default", {}).get("BACKEND", "")
    redis_url = getattr(settings, "REDIS_URL", "")
    if not redis_url:
        return ChannelLayerHealth(ok=True, backend=backend, redis=False)
    try:
        import redis

        client = redis.Redis.from_url(redis_url, socket_connect_timeout=1.0, socket_timeout=1.0)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        log.warning("health: redis ping failed", exc_info=True)
        return ChannelLayerHealth(ok=False, backend=backend, redis=True, error=type(exc).__name__)
    return ChannelLayerHealth(ok=True, backend=backend, redis=True)


def _runners_health() -> list[RunnerHealth]:
    from runs.models import Runner

    now = timezone.now()
    alive = set(Runner.objects.alive(now).values_list("id", flat=True))
    return [
        RunnerHealth(
            id=runner.id,
            host=runner.host,
            pid=runner.pid,
            started_at=runner.started_at,
            last_heartbeat=runner.heartbeat_at,
            alive=runner.id in alive,
        )
        for runner in Runner.objects.filter(stopped_at__isnull=True)[:100]
    ]


def _sandbox_health(runners: list[Any]) -> SandboxHealth:
    """This host's bubblewrap and agents configured `sandbox = "none"`, and what alive runners
    (which may run on other hosts) say they started unsandboxed."""
    from runs import agents

    warnings = agents.sandbox_warnings(settings.HERMESWEB_AGENTS.values())
    for runner in runners:
        for name, caps in (runner.agent_capabilities or {}).items():
            if isinstance(caps, dict) and caps.get("sandbox") == "none":
                warnings.append(f"runner {runner.id} runs agent {name!r} unsandboxed")
    return SandboxHealth(ok=not warnings, bwrap=agents.bwrap().path, warnings=warnings)


def _data_dir_health() -> DataDirHealth:
    """One level deep on every call (doctor walks it all): below a 0700 directory nothing is reachable."""
    from hermesweb.data_dir import settings_warnings

    warnings = settings_warnings(deep=False)
    return DataDirHealth(ok=not warnings, warnings=warnings)


def _alive_runners() -> list[Any]:
    from runs.models import Runner

    return list(Runner.objects.alive().only("id", "agent_capabilities")[:100])


@api.get("/health", response={200: HealthOut, 503: HealthOut}, tags=["health"])
def health(request: HttpRequest) -> Status[HealthOut]:
    """Database, channel layer (a Redis ping when configured), the runners' heartbeats, the
    agent sandbox, and the data directory's modes.

    503 when the database or the channel layer fails; a missing runner is
    reported, not failed, because the web process is still useful without one;
    so are agents that run unsandboxed (`runs.agents.sandbox_warnings`) and a data
    directory open to other local accounts (`hermesweb.data_dir`).
    """
    database = _database_health()
    channel_layer = _channel_layer_health()
    runners = _runners_health() if database.ok else []
    alive = _alive_runners() if database.ok else []
    ok = database.ok and channel_layer.ok
    body = HealthOut(
        ok=ok,
        database=database,
        channel_layer=channel_layer,
        runners=runners,
        sandbox=_sandbox_health(alive),
        data_dir=_data_dir_health(),
        placement=placement_health(request.auth) if database.ok else None,
    )
    return Status(200 if ok else 503, body)


# ---------------------------------------------------------------- fallback

# Registered last so it only catches what no route matched: unknown /api/
# paths get the JSON 404 instead of Django's HTML page.
_fallback = Router()


@_fallback.api_operation(["GET", "POST", "PUT", "PATCH", "DELETE"], "/{path:rest}", include_in_schema=False)
def unknown_endpoint(request: HttpRequest, rest: str) -> None:
    raise not_found("endpoint")


api.add_router("", _fallback)
