"""Settings, read from the environment (see README "Configuration").

A bad value raises ImproperlyConfigured naming the variable. With no
DATABASE_URL the workbench runs in its embedded default: SQLite under
HERMESWEB_DATA_DIR, a generated SECRET_KEY kept there, no Redis.
"""

from __future__ import annotations

import os
import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from hermesweb.data_dir import narrow_sqlite, prepare, private_umask
from hermesweb.env import (
    check_data_dir_outside_roots,
    env_bool,
    env_float,
    env_int,
    env_list,
    env_origins,
    env_roots,
    env_str,
)
from hermesweb.private_files import create_private_file, restrict
from runs.agents import load_agents
from runs.pgcheck import check_pooled

BASE_DIR = Path(__file__).resolve().parent.parent

# Every process of ours (web, runner, commands, tests) loads these settings before it writes a
# byte: from here on what it and its agents create is owner-only (docs/security.md, "The data
# directory"), and the data directory is 0700 however an older version left it.
private_umask()
DATA_DIR = Path(env_str("HERMESWEB_DATA_DIR", str(BASE_DIR / "var"))).resolve()
prepare(DATA_DIR)

DEBUG = env_bool("DEBUG", False)

_database_url = env_str("DATABASE_URL")
EMBEDDED = not _database_url


def _secret_key() -> str:
    configured = env_str("SECRET_KEY")
    if configured:
        return configured
    if EMBEDDED or DEBUG:
        # The embedded default generates a key once and keeps it, so sessions survive restarts.
        # Created owner-only and whole; a process starting at the same time keeps the first one.
        key_file = DATA_DIR / "secret_key"
        if not key_file.exists():
            create_private_file(key_file, secrets.token_urlsafe(50))
        restrict(key_file)
        return key_file.read_text().strip()
    raise ImproperlyConfigured("SECRET_KEY must be set when DATABASE_URL is set and DEBUG is off")


SECRET_KEY = _secret_key()

ALLOWED_HOSTS = env_list("HERMESWEB_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("HERMESWEB_CSRF_TRUSTED_ORIGINS", [])
# Origins besides the request's own that may open a WebSocket (hermesweb/origins.py).
HERMESWEB_ALLOWED_ORIGINS = env_origins("HERMESWEB_ALLOWED_ORIGINS")
if not DEBUG:
    # `*` turns the Host and socket origin checks off: a development convenience only.
    for _name, _values in (
        ("HERMESWEB_ALLOWED_HOSTS", ALLOWED_HOSTS),
        ("HERMESWEB_ALLOWED_ORIGINS", HERMESWEB_ALLOWED_ORIGINS),
    ):
        if "*" in _values:
            raise ImproperlyConfigured(f"{_name} may not contain '*' unless DEBUG is on")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "axes",
    "hermesweb",
    "projects",
    "runs",
    "intents",
    "workspace",
    "automations",
    "worktrees",
]

# The stock middleware, each declared sync-only: one thread hop per request instead of
# twelve under daphne (hermesweb/middleware.py).
MIDDLEWARE = [
    "hermesweb.middleware.SecurityMiddleware",
    "hermesweb.middleware.SessionMiddleware",
    "hermesweb.middleware.CommonMiddleware",
    "hermesweb.middleware.CsrfViewMiddleware",
    "hermesweb.middleware.AuthenticationMiddleware",
    "hermesweb.middleware.MessageMiddleware",
    "hermesweb.middleware.XFrameOptionsMiddleware",
    "hermesweb.middleware.AdminContentSecurityPolicy",
    # Last, as django-axes requires: it answers a locked-out sign-in with 429.
    "hermesweb.middleware.AxesMiddleware",
]

ROOT_URLCONF = "hermesweb.urls"
ASGI_APPLICATION = "hermesweb.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

if EMBEDDED:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": DATA_DIR / "hermesweb.sqlite3",
            "OPTIONS": {
                # IMMEDIATE takes the write lock at BEGIN, so two writers queue
                # instead of failing a lock upgrade mid-transaction.
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            "TEST": {"NAME": DATA_DIR / "test-hermesweb.sqlite3"},
        }
    }
else:
    # 0 turns pooling off. A runner's four journal writer threads each keep a connection.
    DB_POOL_MAX = env_int("HERMESWEB_DB_POOL_MAX", 20, minimum=0)
    DB_POOL_TIMEOUT = env_int("HERMESWEB_DB_POOL_TIMEOUT", 10, minimum=1)
    try:
        DATABASES = {"default": dj_database_url.parse(_database_url)}
    except ValueError as exc:
        raise ImproperlyConfigured(f"DATABASE_URL is not a valid database URL: {exc}") from None
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and DB_POOL_MAX:
        # Under ASGI each request runs in a thread of its own, so a "persistent" connection
        # lives for one request: without a pool every API call and every socket's database
        # step forked a PostgreSQL backend first, most of a small request. Connections
        # now return to a per-process pool when Django closes them (CONN_MAX_AGE must be 0).
        DATABASES["default"]["CONN_MAX_AGE"] = 0
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": 1,
            "max_size": DB_POOL_MAX,
            "timeout": DB_POOL_TIMEOUT,
            # A connection the server closed while it sat in the pool (a restart, a failover)
            # is replaced before a request gets it, at no round trip's cost.
            "check": check_pooled,
        }
    if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
        DATABASES["default"].setdefault("OPTIONS", {}).update(
            {"transaction_mode": "IMMEDIATE", "timeout": 30}
        )
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A thread keeps its SQLite connection (a file handle, no server behind it) across the
    # requests it serves (hermesweb/handlers.py): opening one, pragmas and schema, was a third
    # of a small request. One left in a transaction, or broken, is still closed.
    DATABASES["default"]["CONN_MAX_AGE"] = None
    # A database an older version left 0644 would hand its mode to every new WAL.
    narrow_sqlite(DATABASES["default"]["NAME"])

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL")
if REDIS_URL:
    if not REDIS_URL.startswith(("redis://", "rediss://", "unix://")):
        raise ImproperlyConfigured(f"REDIS_URL must be a redis:// URL, got {REDIS_URL!r}")
    from hermesweb.channel_layer import redis_channel_layer

    # Sealed with a key derived from SECRET_KEY: whoever reaches Redis without it cannot put a
    # word in anyone's socket (docs/security.md, "The channel layer").
    CHANNEL_LAYERS = {
        "default": redis_channel_layer(REDIS_URL, env_str("HERMESWEB_REDIS_PREFIX", "hermesweb"), SECRET_KEY)
    }
else:
    # No cross-process doorbell: consumers and the runner poll the database,
    # which holds the truth anyway (docs/live-delivery.md).
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Password guessing on /login/ and /admin/login/ (django-axes): past the limit of failures for
# one username from one address, or the much higher one for all names from one address,
# sign-ins are refused (429) until the cool-off ends (hermesweb.auth.LoginThrottleHandler).
# Tokens and existing sessions are never throttled; the admin lists attempts and lockouts.
AUTHENTICATION_BACKENDS = [
    "hermesweb.auth.LoginThrottleBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("HERMESWEB_LOGIN_FAILURE_LIMIT", 5, minimum=1)
HERMESWEB_LOGIN_ADDRESS_FAILURE_LIMIT = env_int("HERMESWEB_LOGIN_ADDRESS_FAILURE_LIMIT", 100, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_float("HERMESWEB_LOGIN_LOCKOUT_MINUTES", 15.0, minimum=0.1))
# Per username *and* address: failures for made-up names do not lock out a real user.
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_HANDLER = "hermesweb.auth.LoginThrottleHandler"
AXES_RESET_ON_SUCCESS = True
# axes looks for its middleware by name; ours is the same class declared sync-only.
SILENCED_SYSTEM_CHECKS = ["axes.W002"]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/login/"
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Where collectstatic copies the files for nginx: outside the 0700 data directory when nginx
# serves them (docs/deploy.md), and world-readable whatever the umask, since nginx runs as its own user.
STATIC_ROOT = Path(env_str("HERMESWEB_STATIC_ROOT", str(DATA_DIR / "static"))).resolve()
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # `{% static %}` URLs carry the file's version, so browsers may keep them (docs/ui.md, "Loading").
    "staticfiles": {
        "BACKEND": "hermesweb.static_assets.VersionedStaticStorage",
        "OPTIONS": {"file_permissions_mode": 0o644, "directory_permissions_mode": 0o755},
    },
}

# Product settings.
(DATA_DIR / "projects").mkdir(exist_ok=True)
HERMESWEB_ALLOWED_ROOTS = env_roots("HERMESWEB_ALLOWED_ROOTS", [DATA_DIR / "projects"])
# The default root lies inside the data directory; the other way round a project could hold it.
check_data_dir_outside_roots(DATA_DIR, HERMESWEB_ALLOWED_ROOTS)
HERMESWEB_AGENTS = load_agents(DATA_DIR)
HERMESWEB_DEFAULT_AGENT = env_str("HERMESWEB_DEFAULT_AGENT", "demo")
if HERMESWEB_DEFAULT_AGENT not in HERMESWEB_AGENTS:
    raise ImproperlyConfigured(f"HERMESWEB_DEFAULT_AGENT names unknown agent {HERMESWEB_DEFAULT_AGENT!r}")

HERMESWEB_LEASE_SECONDS = env_float("HERMESWEB_LEASE_SECONDS", 15.0, minimum=1.0)
HERMESWEB_AGENT_IDLE_SECONDS = env_float("HERMESWEB_AGENT_IDLE_SECONDS", 600.0, minimum=1.0)
HERMESWEB_RUNNER_POLL_SECONDS = env_float("HERMESWEB_RUNNER_POLL_SECONDS", 0.2, minimum=0.01)
# Warm agents (docs/runner.md, "Warm-up and memory"): idle agents stopped past this much RSS per
# runner (0: no budget), and a session's warm-up asked at most once per interval.
HERMESWEB_AGENT_MEMORY_MB = env_int("HERMESWEB_AGENT_MEMORY_MB", 4096, minimum=0)
HERMESWEB_WARM_INTERVAL_SECONDS = env_float("HERMESWEB_WARM_INTERVAL_SECONDS", 30.0, minimum=0.0)
HERMESWEB_SHUTDOWN_GRACE_SECONDS = env_float("HERMESWEB_SHUTDOWN_GRACE_SECONDS", 20.0, minimum=0.0)
# After session/cancel, how long an agent gets to end its turn before the runner retires it.
HERMESWEB_CANCEL_GRACE_SECONDS = env_float("HERMESWEB_CANCEL_GRACE_SECONDS", 10.0, minimum=0.1)
HERMESWEB_COALESCE_MS = env_float("HERMESWEB_COALESCE_MS", 30.0, minimum=0.0)
# How long a runner keeps trying database work the database did not answer (a restart, a
# failover) before it fails the run: journal writes, exactly once (docs/journal.md, "Writes the
# database did not answer"), and the turn's idempotent updates (runs.runner.connections.retried).
HERMESWEB_DB_RETRY_SECONDS = env_float("HERMESWEB_DB_RETRY_SECONDS", 60.0, minimum=0.0)
HERMESWEB_MAX_RUNS_PER_RUNNER = env_int("HERMESWEB_MAX_RUNS_PER_RUNNER", 200, minimum=1)
# Capacity (docs/runner.md, "Fairness" and "Placement"): a user's turns executing at once across
# all runners; the labels this runner offers (`runner --labels` overrides), e.g. "host=build-1,gpu".
HERMESWEB_MAX_ACTIVE_RUNS_PER_USER = env_int("HERMESWEB_MAX_ACTIVE_RUNS_PER_USER", 4, minimum=1)
HERMESWEB_RUNNER_LABELS = env_str("HERMESWEB_RUNNER_LABELS", "")
# A page costs the same request handling whatever its size, so large pages let the polling API
# replay near the database's own pace (bench/README.md, replay).
HERMESWEB_EVENTS_PAGE_MAX = env_int("HERMESWEB_EVENTS_PAGE_MAX", 5000, minimum=1)
# …and a polling API page ends once its payloads reach this many characters (at least one event
# a page): 5,000 events of 64 KiB tool output would be hundreds of MB in one answer.
HERMESWEB_EVENTS_PAGE_CHARS = env_int("HERMESWEB_EVENTS_PAGE_CHARS", 4 * 1024 * 1024, minimum=1024)
# Open (waiting) intents per session; a submit past it answers 422 `queue_full`.
HERMESWEB_MAX_QUEUED_INTENTS = env_int("HERMESWEB_MAX_QUEUED_INTENTS", 50, minimum=1)
# Automations (docs/automations.md): a planned time this late was missed (no scheduler ran then),
# and calls one webhook takes per minute before it answers 429.
HERMESWEB_AUTOMATION_MISSED_SECONDS = env_float("HERMESWEB_AUTOMATION_MISSED_SECONDS", 60.0, minimum=1.0)
HERMESWEB_WEBHOOK_RATE_PER_MINUTE = env_int("HERMESWEB_WEBHOOK_RATE_PER_MINUTE", 10, minimum=1)
# One uploaded attachment's size (docs/security.md, "Attachments"); past it, 413 `attachment_too_large`.
HERMESWEB_ATTACHMENT_MAX_BYTES = env_int("HERMESWEB_ATTACHMENT_MAX_BYTES", 10 * 1024 * 1024, minimum=1)
# Any request body, refused with 413 `request_too_large` before it is read (hermesweb/body_limit.py);
# the attachment upload may carry HERMESWEB_ATTACHMENT_MAX_BYTES plus its multipart framing.
HERMESWEB_MAX_REQUEST_BYTES = env_int("HERMESWEB_MAX_REQUEST_BYTES", 2 * 1024 * 1024, minimum=1024)
# A page of the transcript or of rendered turns stops once its prompts and journal payloads reach
# this (runs/transcript_pages.py, page_turns); a single larger run comes cut short, to be read on from.
HERMESWEB_TRANSCRIPT_PAGE_BYTES = env_int("HERMESWEB_TRANSCRIPT_PAGE_BYTES", 4 * 1024 * 1024, minimum=1024)
# Per-user caps (docs/security.md, "Limits"): past one, the request is refused with a `code`.
# Open sockets across every web process (runs/live/socket_quota.py): closed with 4429.
HERMESWEB_MAX_SOCKETS_PER_USER = env_int("HERMESWEB_MAX_SOCKETS_PER_USER", 100, minimum=1)
# Projects and sessions a user may hold (archived ones count): 409 `too_many_projects` / `too_many_sessions`.
HERMESWEB_MAX_PROJECTS_PER_USER = env_int("HERMESWEB_MAX_PROJECTS_PER_USER", 100, minimum=1)
HERMESWEB_MAX_SESSIONS_PER_USER = env_int("HERMESWEB_MAX_SESSIONS_PER_USER", 10_000, minimum=1)
# Bytes of attachments a user may keep, sent or not: 413 `attachment_quota_exceeded`.
HERMESWEB_MAX_ATTACHMENT_BYTES_PER_USER = env_int(
    "HERMESWEB_MAX_ATTACHMENT_BYTES_PER_USER", 1024 * 1024 * 1024, minimum=1
)
# An upload no message named within this many hours is removed (runs.attachments.remove_unsent).
HERMESWEB_UNSENT_ATTACHMENT_HOURS = env_float("HERMESWEB_UNSENT_ATTACHMENT_HOURS", 24.0, minimum=0.01)
# Live delivery (docs/live-delivery.md): the embedded default tails the database at
# LIVE_POLL; with Redis a slower safety poll repairs anything a lost notification hid.
HERMESWEB_LIVE_POLL_SECONDS = env_float("HERMESWEB_LIVE_POLL_SECONDS", 0.1, minimum=0.001)
HERMESWEB_LIVE_SAFETY_POLL_SECONDS = env_float("HERMESWEB_LIVE_SAFETY_POLL_SECONDS", 2.0, minimum=0.001)
HERMESWEB_LIVE_HEARTBEAT_SECONDS = env_float("HERMESWEB_LIVE_HEARTBEAT_SECONDS", 15.0, minimum=0.001)
HERMESWEB_LOG_DIR = DATA_DIR / "logs"
HERMESWEB_LOG_DIR.mkdir(parents=True, exist_ok=True)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    # Secrets are masked in every line before it is written (docs/security.md, "Redaction").
    "filters": {"redact": {"()": "runs.redaction.RedactingLogFilter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["redact"]}},
    "root": {"handlers": ["console"], "level": env_str("HERMESWEB_LOG_LEVEL", "INFO")},
    # axes: failures and lockouts are warnings; its per-login and start-up lines are not kept.
    "loggers": {"django.channels.server": {"level": "WARNING"}, "axes": {"level": "WARNING"}},
}

if not DEBUG and not EMBEDDED:
    SESSION_COOKIE_SECURE = env_bool("HERMESWEB_SECURE_COOKIES", True)
    CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE

# Served over TLS, usually by a proxy in front of daphne (docs/security.md, "Deploying behind
# TLS"): the proxy must set X-Forwarded-Proto itself, overwriting what a client sent.
HERMESWEB_HTTPS = env_bool("HERMESWEB_HTTPS", False)
if HERMESWEB_HTTPS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = env_int("HERMESWEB_HSTS_SECONDS", 31_536_000, minimum=0)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True

os.environ.setdefault("HERMESWEB_DATA_DIR", str(DATA_DIR))
