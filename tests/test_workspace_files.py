"""The project's files: GET /api/projects/{id}/files, GET/PUT /api/projects/{id}/files/content.

Listing, reading with an ETag, saving with If-Match (412 `stale_file`, 428 without; If-None-Match:
* creates). Every path outside the project — `..`, absolute, a symlink that leads out (one
swapped in during the request included), another user's project — is a 404: paths are opened
from the project one component at a time without following a symlink (workspace/fs.py), the
sandbox's rule. docs/workspace.md.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from django.test import Client

from tests import factories

pytestmark = pytest.mark.django_db

RENAME_EXCHANGE = 2
AT_FDCWD = -100


@pytest.fixture
def project(user: Any) -> Any:
    project = factories.ProjectFactory(owner=user)
    root = Path(project.path)
    (root / "src").mkdir()
    (root / "src" / "main.py").write_text("print('hi')\n")
    (root / "README.md").write_text("# Hello\n")
    (root / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 16)
    (root / "data.bin").write_bytes(b"\x00\x01\x02")
    return project


def url(project: Any, path: str, what: str = "files/content") -> str:
    return f"/api/projects/{project.pk}/{what}?path={quote(path)}"


def put(api: Client, project: Any, path: str, data: bytes, **headers: str) -> Any:
    return api.put(url(project, path), data, content_type="application/octet-stream", headers=headers)


def test_a_directory_lists_directories_first(api: Client, project: Any) -> None:
    (Path(project.path) / "link").symlink_to("README.md")
    body = api.get(url(project, "", "files")).json()
    assert body["path"] == "" and body["truncated"] is False
    assert [(e["name"], e["type"]) for e in body["entries"]] == [
        ("src", "dir"),
        ("README.md", "file"),
        ("data.bin", "file"),
        ("link", "symlink"),
        ("logo.png", "file"),
    ]
    inner = api.get(url(project, "src", "files")).json()
    assert inner["path"] == "src" and [e["path"] for e in inner["entries"]] == ["src/main.py"]
    assert inner["entries"][0]["size"] == len("print('hi')\n")


def test_content_is_served_safely_by_kind(api: Client, project: Any) -> None:
    text = api.get(url(project, "src/main.py"))
    assert text.status_code == 200 and text.content == b"print('hi')\n"
    assert text["Content-Type"] == "text/plain; charset=utf-8"
    assert text["X-Content-Type-Options"] == "nosniff"
    assert text["Content-Security-Policy"] == "default-src 'none'; sandbox"
    assert text["ETag"].startswith('"')
    assert api.get(url(project, "logo.png"))["Content-Type"] == "image/png"
    binary = api.get(url(project, "data.bin"))
    assert (
        binary["Content-Type"] == "application/octet-stream" and "attachment" in binary["Content-Disposition"]
    )


def test_saving_needs_the_current_etag_and_creating_needs_if_none_match(api: Client, project: Any) -> None:
    path = Path(project.path) / "README.md"
    etag = api.get(url(project, "README.md"))["ETag"]

    assert put(api, project, "README.md", b"# no precondition\n").status_code == 428
    saved = put(api, project, "README.md", b"# Saved\n", **{"If-Match": etag})
    assert saved.status_code == 200 and path.read_bytes() == b"# Saved\n"
    assert saved["ETag"] == saved.json()["etag"] != etag

    stale = put(api, project, "README.md", b"# lost?\n", **{"If-Match": etag})
    assert stale.status_code == 412 and stale.json()["code"] == "stale_file"
    assert path.read_bytes() == b"# Saved\n"  # never a silent overwrite

    created = put(api, project, "src/new.py", b"x = 1\n", **{"If-None-Match": "*"})
    assert created.status_code == 200 and (Path(project.path) / "src" / "new.py").read_bytes() == b"x = 1\n"
    exists = put(api, project, "src/new.py", b"x = 2\n", **{"If-None-Match": "*"})
    assert exists.status_code == 412


@pytest.mark.parametrize(
    "path",
    [
        "../outside.txt",
        "src/../../outside.txt",
        "/etc/passwd",
        "escape/outside.txt",  # a symlinked directory leading out
        "outlink",  # a symlink to a file outside
        "inlink",  # a symlink even inside: never followed
        "missing.txt",
        "src",  # a directory is no file
    ],
)
def test_every_escape_is_a_404_for_read_list_and_write(
    api: Client, project: Any, tmp_path: Path, path: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "outside.txt").write_text("secret outside\n")
    (Path(project.path) / "escape").symlink_to(outside)
    (Path(project.path) / "outlink").symlink_to(outside / "outside.txt")
    (Path(project.path) / "inlink").symlink_to("README.md")

    assert api.get(url(project, path)).status_code == 404
    if path != "src":
        assert api.get(url(project, path, "files")).status_code == 404
    if path != "missing.txt":
        response = put(api, project, path, b"planted\n", **{"If-None-Match": "*"})
        assert response.status_code == 404, (path, response.content)
        response = put(api, project, path, b"planted\n", **{"If-Match": '"x"'})
        assert response.status_code == 404, (path, response.content)
    assert (outside / "outside.txt").read_text() == "secret outside\n"
    assert sorted(p.name for p in outside.iterdir()) == ["outside.txt"]


def test_another_users_project_is_not_found(api: Client, other_user: Any) -> None:
    theirs = factories.ProjectFactory(owner=other_user)
    (Path(theirs.path) / "theirs.txt").write_text("private\n")
    assert api.get(url(theirs, "theirs.txt")).status_code == 404
    assert api.get(url(theirs, "", "files")).status_code == 404
    assert put(api, theirs, "theirs.txt", b"x", **{"If-None-Match": "*"}).status_code == 404


class Flipper:
    """Swaps the directory `real` and a symlink to `foreign` (renameat2 RENAME_EXCHANGE), nonstop."""

    def __init__(self, real: Path, foreign: Path) -> None:
        self.real, self.link = os.fsencode(real), os.fsencode(real.parent / ".swap")
        os.symlink(foreign, self.link)
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.stop = threading.Event()
        self.flips = 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            if self.libc.renameat2(AT_FDCWD, self.real, AT_FDCWD, self.link, RENAME_EXCHANGE) == 0:
                self.flips += 1

    def __enter__(self) -> Flipper:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def test_a_symlink_swapped_in_during_requests_never_leads_out(
    api: Client, project: Any, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "file.txt").write_text("OUTSIDE\n")
    inside = Path(project.path) / "dir"
    inside.mkdir()
    (inside / "file.txt").write_text("inside\n")
    answers: dict[int, int] = {}
    with Flipper(inside, outside) as flipper:
        # Until some requests were served (the directory in place at that instant) and some not.
        while sum(answers.values()) < 300 or (not answers.get(200) and sum(answers.values()) < 3000):
            response = api.get(url(project, "dir/file.txt"))
            answers[response.status_code] = answers.get(response.status_code, 0) + 1
            assert response.status_code == 404 or response.content == b"inside\n"
            listing = api.get(url(project, "dir", "files"))
            assert listing.status_code == 404 or "file.txt" in listing.content.decode()
            saved = put(api, project, "dir/file.txt", b"written\n", **{"If-Match": '"nope"'})
            assert saved.status_code in (404, 412)
    assert flipper.flips > 100 and answers.get(404) and answers.get(200), (flipper.flips, answers)
    assert (outside / "file.txt").read_text() == "OUTSIDE\n"
