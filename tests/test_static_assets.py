"""Static files: versioned URLs kept for good, plain ones revalidated, served from memory by the
ASGI app before Django, gzipped for a client that takes it (hermesweb/static_assets.py)."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.conf import settings
from django.contrib.staticfiles import finders
from django.templatetags.static import static
from django.test import Client, override_settings

from hermesweb import static_assets
from hermesweb.static_assets import IMMUTABLE, REVALIDATE, StaticFiles, asset
from tests import factories

STATIC = Path(settings.STATICFILES_DIRS[0])


class Served(NamedTuple):
    status: int
    headers: dict[str, str]
    body: bytes


async def _request(path: str, method: str, query: str, headers: dict[str, str]) -> Served:
    async def django(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b"django"})

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1"), *((k.lower().encode(), v.encode()) for k, v in headers.items())],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 80),
    }
    communicator = ApplicationCommunicator(StaticFiles(django), scope)
    await communicator.send_input({"type": "http.request", "body": b""})
    start = await communicator.receive_output(10)
    body = await communicator.receive_output(10)
    await communicator.wait(10)
    return Served(start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body["body"])


def fetch(url: str, method: str = "GET", **headers: str) -> Served:
    path, _, query = url.partition("?")
    return async_to_sync(_request)(path, method, query, {k.replace("_", "-"): v for k, v in headers.items()})


def test_a_versioned_url_is_kept_for_good() -> None:
    url = static("js/main.js")
    assert re.fullmatch(r"/static/js/main\.js\?v=[0-9a-f]{12}", url)
    served = fetch(url)
    assert served.status == 200
    assert served.headers["cache-control"] == IMMUTABLE
    assert served.body == (STATIC / "js/main.js").read_bytes()
    assert served.headers["content-type"].startswith("text/javascript")
    assert served.headers["x-content-type-options"] == "nosniff"


def test_a_plain_or_stale_url_is_revalidated() -> None:
    assert fetch("/static/js/main.js").headers["cache-control"] == REVALIDATE
    stale = fetch("/static/js/main.js?v=000000000000")
    assert stale.headers["cache-control"] == REVALIDATE
    assert stale.body == (STATIC / "js/main.js").read_bytes()


def test_a_client_that_takes_gzip_gets_the_file_gzipped() -> None:
    file = (STATIC / "vendor/highlight.js/highlight.min.js").read_bytes()
    zipped = fetch("/static/vendor/highlight.js/highlight.min.js", accept_encoding="gzip, deflate, br")
    assert zipped.headers["content-encoding"] == "gzip"
    assert zipped.headers["vary"] == "Accept-Encoding"
    assert int(zipped.headers["content-length"]) == len(zipped.body) < len(file) / 2
    assert gzip.decompress(zipped.body) == file
    plain = fetch("/static/vendor/highlight.js/highlight.min.js")
    assert "content-encoding" not in plain.headers
    assert plain.body == file
    assert plain.headers["etag"] != zipped.headers["etag"]


def test_an_unchanged_file_is_answered_304_by_its_etag_or_its_date() -> None:
    first = fetch("/static/css/app.css", accept_encoding="gzip")
    for etag in (first.headers["etag"], fetch("/static/css/app.css").headers["etag"]):
        again = fetch("/static/css/app.css", if_none_match=etag)
        assert (again.status, again.body) == (304, b"")
    by_date = fetch("/static/css/app.css", if_modified_since=first.headers["last-modified"])
    assert by_date.status == 304
    assert fetch("/static/css/app.css", if_none_match='"0000"').status == 200


def test_head_has_no_body_and_other_methods_are_refused() -> None:
    head = fetch("/static/js/main.js", "HEAD")
    assert (head.status, head.body) == (200, b"")
    assert int(head.headers["content-length"]) == len((STATIC / "js/main.js").read_bytes())
    post = fetch("/static/js/main.js", "POST")
    assert (post.status, post.headers["allow"]) == (405, "GET, HEAD")


@pytest.mark.parametrize(
    "path",
    [
        "/static/js/nope.js",
        "/static/js/../../hermesweb/settings.py",
        "/static/../hermesweb/settings.py",
        "/static//etc/passwd",
        "/static/js/./main.js",
        "/static/js\\..\\..\\manage.py",
        "/static/",
    ],
)
def test_a_file_that_is_not_there_or_a_path_that_climbs_is_not_found(path: str) -> None:
    assert fetch(path).status == 404


def test_other_paths_go_on_to_django() -> None:
    assert fetch("/api/health").body == b"django"
    assert fetch("/staticx/js/main.js").body == b"django"


@pytest.fixture
def own_static(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "js").mkdir()
    with override_settings(STATICFILES_DIRS=[tmp_path]):
        finders.get_finder.cache_clear()
        try:
            yield tmp_path
        finally:
            finders.get_finder.cache_clear()


def test_a_file_changed_on_disk_gets_a_new_version_and_its_new_text(own_static: Path) -> None:
    file = own_static / "js" / "new.js"
    file.write_text("export const a = 1;\n")
    before = static("js/new.js")
    assert fetch(before).body == b"export const a = 1;\n"
    file.write_text("export const a = 2; // longer\n")
    after = static("js/new.js")
    assert after != before
    assert fetch(after).body == b"export const a = 2; // longer\n"
    assert fetch(after).headers["cache-control"] == IMMUTABLE
    assert fetch(before).headers["cache-control"] == REVALIDATE
    assert asset("js/new.js") is not None


@pytest.mark.django_db
def test_the_workbench_page_maps_every_module_to_its_version_and_allows_only_that_map(
    client: Client, user: Any
) -> None:
    session = factories.SessionFactory(project=factories.ProjectFactory(owner=user))
    client.force_login(user)
    response = client.get(f"/sessions/{session.pk}/")
    html = response.content.decode()
    found = re.search(r'<script type="importmap">(.*?)</script>', html, re.S)
    assert found is not None
    text = found.group(1)
    imports = json.loads(text)["imports"]
    assert set(imports) == {f"/static/{module}" for module in static_assets.page_modules()}
    assert "/static/js/api.js" in imports
    for plain, versioned in imports.items():
        assert versioned.startswith(plain + "?v=")
        assert fetch(versioned).headers["cache-control"] == IMMUTABLE
    digest = base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
    policy = response["Content-Security-Policy"]
    assert f"script-src 'self' 'sha256-{digest}';" in policy
    assert "unsafe-inline" not in policy
    # The map comes before the first module the page names.
    assert html.index('type="importmap"') < html.index('rel="modulepreload"')
    preloaded = re.findall(r'<link rel="modulepreload" href="([^"]+)">', html)
    assert preloaded and all(href in imports.values() for href in preloaded)
