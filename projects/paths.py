"""Project paths are trusted boundaries: the agent runs with the path as cwd (docs/security.md).

A project path is a strict subdirectory of one of the operator's allowed roots (a root holds
every user's projects), and it neither equals, contains nor sits inside another user's
project. `validate_project_location` applies every rule: the API, the admin form and the
runner (before it starts an agent) all call it.

A path at or under another user's project answers 409 `path_taken` before anything looks at the
disk, so no answer tells whether a directory exists in someone else's tree.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings

from projects.refusals import Refused

# Deeper than any real project; each prefix is resolved on its own (refuse_inside_other_projects).
MAX_COMPONENTS = 128


class PathRefused(Refused, ValueError):
    """A refused path: `code` is the API's error code, `status` 422 (bad input) or 409 (taken)."""

    def __init__(self, code: str, message: str, status: int = 422) -> None:
        super().__init__(status, code, message)


def allowed_roots() -> list[Path]:
    return list(settings.HERMESWEB_ALLOWED_ROOTS)


def _inside(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def validate_project_path(raw: str) -> Path:
    """Return the resolved directory, or raise PathRefused (422). No database access.

    Refuses relative paths and any `..` component outright (even when it would resolve inside
    a root) and resolves symlinks before the containment check, so a link pointing out of the
    allowed roots is refused. The roots are checked before the path is tested for existence:
    outside them the answer is `path_outside_roots` whether or not the directory exists.
    """
    return _existing_directory(_resolve_inside_roots(raw), raw)


def _absolute(raw: str) -> PurePosixPath:
    """The path as written, or PathRefused (422) for what no rule needs the disk to refuse."""
    if not isinstance(raw, str) or not raw or "\x00" in raw:
        raise PathRefused("path_invalid", "Path must be a non-empty string.")
    pure = PurePosixPath(raw)
    if not pure.is_absolute():
        raise PathRefused("path_not_absolute", f"Path {raw!r} must be absolute.")
    if ".." in pure.parts:
        raise PathRefused("path_traversal", f"Path {raw!r} must not contain '..'.")
    if len(pure.parts) > MAX_COMPONENTS:
        raise PathRefused("path_invalid", f"Path {raw!r} has more than {MAX_COMPONENTS} components.")
    return pure


def _resolve_inside_roots(raw: str) -> Path:
    """Every rule of validate_project_path but existence: the resolved path, or PathRefused (422)."""
    _absolute(raw)
    try:
        resolved = Path(raw).resolve()
    except (OSError, RuntimeError, ValueError):
        raise PathRefused("path_invalid", f"Path {raw!r} cannot be resolved.") from None
    roots = allowed_roots()
    if not any(_inside(resolved, root) for root in roots):
        shown = ", ".join(str(r) for r in roots)
        raise PathRefused("path_outside_roots", f"Path {raw!r} is outside the allowed roots ({shown}).")
    # A root (or a directory holding one) is every user's projects at once.
    if any(_inside(root, resolved) for root in roots):
        raise PathRefused(
            "path_is_root", f"Path {raw!r} is an allowed root; use a directory inside it for a project."
        )
    return resolved


def _existing_directory(resolved: Path, raw: str) -> Path:
    try:
        is_dir = resolved.is_dir()
    except OSError:  # a name too long, a link loop: Python 3.13's is_dir raises some of these
        is_dir = False
    if not is_dir:
        raise PathRefused("path_not_directory", f"Path {raw!r} is not an existing directory.")
    return resolved


def _taken(raw: str) -> PathRefused:
    return PathRefused("path_taken", f"Path {raw!r} overlaps another user's project.", status=409)


def refuse_inside_other_projects(raw: str, *, owner_id: Any, project_id: int | None = None) -> None:
    """PathRefused (409 `path_taken`) when `raw`, as written or through any of its prefixes'
    symlinks, lies at or under another user's project; no other check has looked at the disk yet.

    Otherwise the answer under someone's project would say what is there: `path_not_directory`
    for a missing name, `path_outside_roots` for a link out, `path_invalid` for a loop. Each
    prefix is resolved (a link of one's own into another's project counts).
    """
    from projects.models import Project

    parts = _absolute(raw).parts[1:]
    places = [Path("/", *parts)]
    for end in range(1, len(parts) + 1):
        try:
            places.append(Path(os.path.realpath(Path("/", *parts[:end]))))
        except (OSError, RuntimeError, ValueError):  # a name too long: the 422s below say so
            break
    at_or_above = sorted({str(up) for place in places for up in (place, *place.parents)})
    others = Project.objects.exclude(owner_id=owner_id)
    if project_id is not None:
        others = others.exclude(pk=project_id)
    for start in range(0, len(at_or_above), 500):  # under SQLite's bound on parameters
        if others.filter(path__in=at_or_above[start : start + 500]).exists():
            raise _taken(raw)


def check_path_free(path: Path, *, owner_id: Any, project_id: int | None = None) -> None:
    """Raise PathRefused(409 `path_taken`) when `path` equals, contains or sits inside a project
    of another user. The owner's own projects may overlap: they see the same files anyway."""
    from django.db.models import Q

    from projects.models import Project

    text = str(path)
    ancestors = [str(parent) for parent in path.parents]
    candidates = (
        Project.objects.exclude(owner_id=owner_id)
        # startswith is case-insensitive on SQLite: a superset, narrowed exactly below.
        .filter(Q(path=text) | Q(path__startswith=text.rstrip("/") + "/") | Q(path__in=ancestors))
        .values_list("pk", "path")
    )
    for pk, other in candidates:
        if pk == project_id:
            continue
        other_path = Path(other)
        if _inside(path, other_path) or _inside(other_path, path):
            raise _taken(str(path))


def validate_project_location(raw: str, *, owner_id: Any, project_id: int | None = None) -> Path:
    """Every rule for a project's directory: the resolved path, or PathRefused.

    `owner_id` is the project's owner (not whoever is asking), `project_id` the project being
    changed (None for a new one). The runner calls this before it starts an agent, so a path
    saved under older rules, or a root reconfigured since, never becomes an agent's cwd.
    """
    refuse_inside_other_projects(raw, owner_id=owner_id, project_id=project_id)
    resolved = _resolve_inside_roots(raw)
    check_path_free(resolved, owner_id=owner_id, project_id=project_id)
    return _existing_directory(resolved, raw)
