"""The workbench's CSS and ES modules: content-versioned URLs, served from memory before Django.

Design note: docs/ui.md ("Loading"). There is no bundler, so a module's imports carry no content
hash. Every URL the pages give out carries one instead (`?v=`, `VersionedStaticStorage` for
`{% static %}`), and the workbench page's import map (`import_map`) sends each module's plain
URL, which is what a relative import resolves to, to its versioned one. A request whose `v` is
the file's current version may be kept for good (`immutable`): a returning user's page loads no
module again, where it used to revalidate each of them (a round trip through every middleware).
Any other request is answered `no-cache`, as before, so an old page never pins a new file.

`StaticFiles` answers `/static/` in the ASGI app itself, from memory (gzipped where the client
takes it), without Django's middleware: no static file carries anything of a user.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import json
import mimetypes
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple
from urllib.parse import parse_qs

from django.conf import settings
from django.contrib.staticfiles import finders
from django.contrib.staticfiles.storage import StaticFilesStorage
from django.utils.http import http_date

from hermesweb.body_limit import ASGIApp, Receive, Scope, Send

IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"
# Text worth compressing; the vendored modules shrink to about a third.
COMPRESSIBLE = ("text/", "application/javascript", "application/json", "image/svg+xml")
MIN_GZIP_BYTES = 1024
VERSION_CHARS = 12
# What Django's SecurityMiddleware would add to these answers (settings: the defaults).
SECURITY_HEADERS = ((b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"same-origin"))


@dataclass(frozen=True)
class Asset:
    """One static file as last read from disk."""

    body: bytes
    gzipped: bytes | None  # None: not worth it, or not text
    content_type: str
    version: str  # the start of the content's SHA-256
    last_modified: str
    stamp: tuple[int, int]  # (mtime_ns, size) when read: a change on disk reads it again

    def etag(self, encoded: bool) -> str:
        return f'"{self.version}-gz"' if encoded else f'"{self.version}"'


_assets: dict[str, tuple[str, Asset]] = {}  # path under the static URL → (file, asset); found ones only


def clean_path(path: str) -> str | None:
    """`path` under the static URL as the finders take it, or None for one that climbs or is odd."""
    if not path or "\\" in path or "\x00" in path:
        return None
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return None
    return posixpath.join(*parts)


def asset(path: str) -> Asset | None:
    """The static file at `path` (under the static URL), read again if it changed on disk."""
    clean = clean_path(path)
    if clean is None:
        return None
    cached = _assets.get(clean)
    if cached is not None:
        file, found = cached
    else:
        located = finders.find(clean)
        if not located or not isinstance(located, str):
            return None
        file, found = located, None
    try:
        stat = os.stat(file)
    except OSError:
        _assets.pop(clean, None)
        return None
    stamp = (stat.st_mtime_ns, stat.st_size)
    if found is not None and found.stamp == stamp:
        return found
    fresh = _read(file, stamp, stat.st_mtime)
    _assets[clean] = (file, fresh)
    return fresh


def _read(file: str, stamp: tuple[int, int], mtime: float) -> Asset:
    body = Path(file).read_bytes()
    content_type = mimetypes.guess_type(file)[0] or "application/octet-stream"
    compress = content_type.startswith(COMPRESSIBLE) and len(body) >= MIN_GZIP_BYTES
    return Asset(
        body=body,
        gzipped=gzip.compress(body, mtime=0) if compress else None,
        content_type=f"{content_type}; charset=utf-8" if content_type.startswith("text/") else content_type,
        version=hashlib.sha256(body).hexdigest()[:VERSION_CHARS],
        last_modified=http_date(mtime),
        stamp=stamp,
    )


class VersionedStaticStorage(StaticFilesStorage):
    """`{% static %}` URLs with the file's version (`?v=`), so the browser may keep them for good."""

    def url(self, name: str | None) -> str:
        plain = self.plain_url(name)
        found = asset(name) if name else None
        return f"{plain}?v={found.version}" if found is not None else plain

    def plain_url(self, name: str | None) -> str:
        """The URL without a version: what a module's relative import resolves to."""
        return super().url(name)


class ImportMap(NamedTuple):
    """The workbench page's `<script type="importmap">` text, and its CSP source."""

    text: str
    csp_source: str  # 'sha256-…' of `text`: the CSP refuses any other inline script


def import_map(modules: tuple[str, ...]) -> ImportMap:
    """Each of `modules` (paths under the static URL) from its plain URL to its versioned one."""
    storage = VersionedStaticStorage()
    imports = {storage.plain_url(module): storage.url(module) for module in modules}
    # JSON in an HTML script element: no "<" may reach the parser ("</script>").
    text = json.dumps({"imports": imports}, separators=(",", ":")).replace("<", "\\u003c")
    digest = base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
    return ImportMap(text, f"'sha256-{digest}'")


@functools.cache
def page_modules() -> tuple[str, ...]:
    """Every ES module under the static root: those a page imports, and those it imports later.

    Listed once per process, as `preload.module_closure` reads the imports once: a new module
    needs a restart, a changed one does not (`asset` reads its version again).
    """
    return tuple(path for path in _own_files() if path.endswith(".js"))


def warm() -> None:
    """Read the workbench's own static files now, at start-up, rather than at a page's first load."""
    for path in _own_files():
        asset(path)


def _own_files() -> list[str]:
    root = Path(settings.STATICFILES_DIRS[0])
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


# ------------------------------------------------------------------ answering


class Answer(NamedTuple):
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


def answer(path: str, method: str, query: str, request_headers: dict[bytes, bytes]) -> Answer:
    """The answer to a request for the static file at `path` (under the static URL)."""
    if method not in ("GET", "HEAD"):
        return _plain(405, b"method not allowed", [(b"allow", b"GET, HEAD")])
    found = asset(path)
    if found is None:
        return _plain(404, b"not found")
    wanted = parse_qs(query).get("v", [""])[0]
    encoded = found.gzipped is not None and b"gzip" in request_headers.get(b"accept-encoding", b"")
    headers = [
        (b"cache-control", (IMMUTABLE if wanted == found.version else REVALIDATE).encode()),
        (b"etag", found.etag(encoded).encode()),
        (b"last-modified", found.last_modified.encode()),
        *SECURITY_HEADERS,
    ]
    if found.gzipped is not None:
        headers.append((b"vary", b"Accept-Encoding"))
    if _not_modified(found, request_headers):
        return Answer(304, headers, b"")
    body = found.gzipped if encoded and found.gzipped is not None else found.body
    headers += [(b"content-type", found.content_type.encode()), (b"content-length", str(len(body)).encode())]
    if encoded:
        headers.append((b"content-encoding", b"gzip"))
    return Answer(200, headers, b"" if method == "HEAD" else body)


def _not_modified(found: Asset, request_headers: dict[bytes, bytes]) -> bool:
    tags = request_headers.get(b"if-none-match")
    if tags is not None:
        return any(
            tag.strip().removeprefix(b"W/").decode("latin-1") in (found.etag(False), found.etag(True))
            for tag in tags.split(b",")
        )
    return request_headers.get(b"if-modified-since", b"").decode("latin-1") == found.last_modified


def _plain(status: int, text: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> Answer:
    headers = [(b"content-type", b"text/plain; charset=utf-8"), *SECURITY_HEADERS, *(extra or [])]
    return Answer(status, [*headers, (b"content-length", str(len(text)).encode())], text)


class StaticFiles:
    """ASGI middleware: `/static/…` answered from memory (`answer`), everything else passed on."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.prefix = "/" + settings.STATIC_URL.lstrip("/")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(self.prefix):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        # Reading a changed file and compressing it is a few ms at most, once per change.
        result = answer(
            scope["path"].removeprefix(self.prefix),
            scope["method"],
            scope["query_string"].decode("latin-1"),
            headers,
        )
        await send(
            {
                "type": "http.response.start",
                "status": result.status,
                "headers": result.headers,
                "trailers": False,
            }
        )
        await send({"type": "http.response.body", "body": result.body, "more_body": False})
