"""Deployment settings: TLS behind a proxy, and the secret files the embedded default writes.

`HERMESWEB_HTTPS=1` turns on HSTS, trusts the proxy's X-Forwarded-Proto and marks cookies
Secure (before, Secure cookies came only outside the embedded mode, and never HSTS).
`secret_key` and `initial-password` were written, then chmod-ed: readable by everyone in
between; the initial password was printed on every bootstrap and stayed on disk for good.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client

from hermesweb.private_files import create_private_file

REPO = Path(__file__).resolve().parent.parent


def python(tmp_path: Path, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("HERMESWEB_", "DATABASE_URL", "REDIS_URL"))
    }
    base.pop("SECRET_KEY", None)
    base.pop("DEBUG", None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO,
        env={
            **base,
            "DJANGO_SETTINGS_MODULE": "hermesweb.settings",
            "HERMESWEB_DATA_DIR": str(tmp_path),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


SHOW_TLS = """
import json, django
django.setup()
from django.conf import settings as s
print(json.dumps(
    [s.SECURE_HSTS_SECONDS, s.SECURE_PROXY_SSL_HEADER, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE]
))
"""


# ---------------------------------------------------------------- TLS


def test_https_turns_on_hsts_the_proxy_header_and_secure_cookies(tmp_path: Path) -> None:
    result = python(tmp_path, SHOW_TLS, HERMESWEB_HTTPS="1")

    assert result.returncode == 0, result.stderr
    hsts, header, session_secure, csrf_secure = json.loads(result.stdout)
    assert hsts >= 31_536_000
    assert header == ["HTTP_X_FORWARDED_PROTO", "https"]
    assert session_secure and csrf_secure


def test_without_https_the_embedded_default_sets_none_of_it(tmp_path: Path) -> None:
    result = python(tmp_path, SHOW_TLS)

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [0, None, False, False]


def test_behind_the_proxy_pages_carry_hsts_and_sign_in_sets_a_secure_cookie(user: Any, settings: Any) -> None:
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SECURE_HSTS_SECONDS = 31_536_000
    settings.SESSION_COOKIE_SECURE = settings.CSRF_COOKIE_SECURE = True
    client = Client(HTTP_X_FORWARDED_PROTO="https")

    page = client.get("/login/")
    signed_in = client.post("/login/", {"username": "ada", "password": "correct horse battery staple"})

    assert page["Strict-Transport-Security"].startswith("max-age=31536000")
    assert signed_in.status_code == 302
    assert signed_in.cookies["sessionid"]["secure"]


# ---------------------------------------------------------------- secret files

# Records the mode of the watched file at every audit event after it appears: the file must
# never be seen with group or other bits, not even between its creation and a chmod.
WATCH = """
import os, sys
seen, busy = set(), [False]
def watch(event, args):
    if busy[0]:
        return
    busy[0] = True
    try:
        seen.add(oct(os.stat(WATCHED).st_mode & 0o777))
    except FileNotFoundError:
        pass
    finally:
        busy[0] = False
sys.addaudithook(watch)
"""


def test_the_generated_secret_key_is_never_readable_by_others(tmp_path: Path) -> None:
    code = f"""
    WATCHED = {str(tmp_path / "secret_key")!r}
    {textwrap.indent(WATCH, "    ").strip()}
    os.umask(0o022)
    import django
    django.setup()
    print(sorted(seen))
    """
    result = python(tmp_path, code)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['0o600']"


def test_the_initial_password_file_is_never_readable_by_others(tmp_path: Path) -> None:
    code = f"""
    WATCHED = {str(tmp_path / "initial-password")!r}
    import django
    django.setup()
    from django.core.management import call_command
    call_command("migrate", verbosity=0)
    {textwrap.indent(WATCH, "    ").strip()}
    os.umask(0o022)
    call_command("bootstrap")
    print(sorted(seen))
    """
    result = python(tmp_path, code)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "['0o600']"


def test_a_private_file_is_created_once_and_never_overwritten(tmp_path: Path) -> None:
    directory = tmp_path / "private"
    directory.mkdir()
    path = directory / "secret"
    old_umask = os.umask(0)
    try:
        assert create_private_file(path, "first")
        assert not create_private_file(path, "second")
    finally:
        os.umask(old_umask)

    assert path.read_text() == "first"
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in directory.iterdir()) == ["secret"]  # no temporary left


def test_an_existing_secret_key_with_a_wide_mode_is_restricted(tmp_path: Path) -> None:
    key = tmp_path / "secret_key"
    key.write_text("kept-key")
    key.chmod(0o644)

    result = python(
        tmp_path, "import django; django.setup(); from django.conf import settings as s; print(s.SECRET_KEY)"
    )

    assert result.stdout.strip() == "kept-key"
    assert key.stat().st_mode & 0o777 == 0o600


# ---------------------------------------------------------------- the initial password


@pytest.fixture
def data_dir(tmp_path: Path, settings: Any) -> Path:
    settings.DATA_DIR = tmp_path
    return tmp_path


def bootstrap() -> str:
    out = io.StringIO()
    call_command("bootstrap", stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_the_initial_password_is_printed_once_and_removed_at_the_first_sign_in(data_dir: Path) -> None:
    first = bootstrap()
    password = (data_dir / "initial-password").read_text().strip()
    second = bootstrap()

    assert password in first
    assert password not in second
    assert "initial-password" in second
    assert (data_dir / "initial-password").stat().st_mode & 0o777 == 0o600

    response = Client().post("/login/", {"username": "admin", "password": password})

    assert response.status_code == 302
    assert not (data_dir / "initial-password").exists()
    assert "changepassword" in bootstrap()


@pytest.mark.django_db
def test_another_users_sign_in_leaves_the_initial_password(data_dir: Path, user: Any) -> None:
    bootstrap()

    response = Client().post("/login/", {"username": "ada", "password": "correct horse battery staple"})

    assert response.status_code == 302
    assert (data_dir / "initial-password").exists()
