"""Shared fixtures: users, API clients, an allowed project root per test.

pytest-django loads settings before this file is imported, so HERMESWEB_DATA_DIR
cannot be redirected from here; instead each run gets its own test database
(below), which keeps two concurrent `pytest` runs in one checkout apart.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client

from tests import factories

# The helpers' own asserts (journal checks, waits) report their operands as a test's do.
pytest.register_assert_rewrite("tests.support")
pytest_plugins = ["tests.support.hermes_fixtures"]


def pytest_configure(config: pytest.Config) -> None:
    # Hashing a password with the production hasher takes ~0.3 s per user.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(scope="session", autouse=True)
def _views_imported() -> None:
    """Import every view module before any test patches what one imports by name.

    A module first imported while a test has patched, say, `runs.transcript.materialize` keeps
    the patch for good (`from runs.transcript import materialize`), and every later test on that
    worker fails with it: which test resolves the first URL depended on xdist's scheduling.
    """
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 - loading the URLconf imports the views


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    vendor = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    skip_postgres = pytest.mark.skip(reason="needs PostgreSQL: set DATABASE_URL=postgres://…")
    skip_redis = pytest.mark.skip(reason="needs Redis: set REDIS_URL=redis://…")
    for item in items:
        if "postgres" in item.keywords and vendor not in ("postgresql", "postgis"):
            item.add_marker(skip_postgres)
        if "redis" in item.keywords and not getattr(settings, "REDIS_URL", ""):
            item.add_marker(skip_redis)
        if item.get_closest_marker("sqlite") and vendor != "sqlite3":
            item.add_marker(
                pytest.mark.skip(reason="about SQLite itself: bin/test runs it in its SQLite pass")
            )


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix: None) -> Iterator[None]:
    """A test database of this run's own: SQLite in a temp dir, PostgreSQL suffixed with the pid."""
    db = settings.DATABASES["default"]
    test = db.setdefault("TEST", {})
    directory = None
    if db["ENGINE"].endswith("sqlite3"):
        directory = tempfile.mkdtemp(prefix="hermesweb-test-db-")
        test["NAME"] = os.path.join(directory, "test.sqlite3")
    else:
        test["NAME"] = f"{test.get('NAME') or 'test_' + db['NAME']}_{os.getpid()}"
    yield
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """pytest-django's, and then nothing left holding a connection when it drops the test database.

    The journal writer threads keep theirs, and PostgreSQL's pool keeps idle ones open:
    the drop failed ("being accessed by other users") and test databases piled up.
    """
    yield
    from tests.support.runner import close_writer_threads

    with django_db_blocker.unblock():
        close_writer_threads()
        if connection.vendor == "postgresql":
            # Any other thread's connection (asgiref's executors keep theirs): the database is
            # this process's alone, so whatever is still connected to it is ours to end.
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
        connection.close()
        if hasattr(connection, "close_pool"):
            connection.close_pool()


@pytest.fixture(autouse=True)
def allowed_root(tmp_path: Path, settings: Any) -> Path:
    """Project paths are validated against HERMESWEB_ALLOWED_ROOTS: a fresh root per test."""
    root = (tmp_path / "projects").resolve()
    root.mkdir()
    settings.HERMESWEB_ALLOWED_ROOTS = [root]
    return root


@pytest.fixture
def user(db: None) -> Any:
    return factories.UserFactory(username="ada")


@pytest.fixture
def other_user(db: None) -> Any:
    return factories.UserFactory(username="mallory")


@pytest.fixture
def staff_user(db: None) -> Any:
    return factories.UserFactory(username="root", is_staff=True)


@pytest.fixture
def api(user: Any) -> Client:
    """A browser-like client signed in as `user` (session auth; CSRF not enforced)."""
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def anonymous() -> Client:
    return Client()


def token_client(user: Any) -> Client:
    _, raw = factories.ApiToken.issue(user, name="tests")
    return Client(headers={"Authorization": f"Bearer {raw}"})


@pytest.fixture
def bearer(user: Any) -> Client:
    """A script-like client authenticated by `user`'s personal token."""
    return token_client(user)


@pytest.fixture
def project(user: Any) -> Any:
    return factories.ProjectFactory(owner=user)


@pytest.fixture
def session(project: Any) -> Any:
    return factories.SessionFactory(project=project)


@pytest.fixture
def database_name() -> str:
    """The test database's name as other processes must use it."""
    return str(connection.settings_dict["NAME"])


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    """Where this test's subprocesses (runners, daphne) write their logs."""
    path = tmp_path / "logs"
    path.mkdir()
    return path


@pytest.fixture
def runners(logs: Path) -> Iterator[list[Any]]:
    """Runner subprocesses the test starts; stopped (SIGTERM, then kill) at teardown."""
    procs: list[Any] = []
    yield procs
    for proc in procs:
        proc.signal(signal.SIGCONT)  # a paused (SIGSTOP) runner ignores SIGTERM until continued
        proc.stop()


@pytest.fixture
def pg_proxy() -> Iterator[Any]:
    """A proxy in front of the test database that the test can take down (tests/support/pgproxy.py).

    Ask for it before `runners`: fixtures end in reverse order, and a runner whose database
    went away first spends its whole retry deadline on the way out (30 s of teardown).
    """
    from tests.support.pgproxy import PgProxy

    conf = connection.settings_dict
    proxy = PgProxy(conf.get("HOST") or "127.0.0.1", int(conf.get("PORT") or 5432)).start()
    yield proxy
    proxy.stop()
