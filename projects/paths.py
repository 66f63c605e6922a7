"""Project paths are trusted boundaries: the agent runs with the path as cwd (docs/security.md).

A project path is a strict subdirectory of one of the operator's allowed roots (a root holds
every user's projects), and it neither equals, contains nor sits inside another user's
project. `validate_project_location` applies every rule: the API, the admin form and the
runner (before it starts an agent) all call it.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from django.conf import settings


class PathRefused(ValueError):
    """A refused path: `code` is the API's error code, `status` 422 (bad input) or 409 (taken)."""

    def __init__(self, code: str, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


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
    if not isinstance(raw, str) or not raw or "\x00" in raw:
        raise PathRefused("path_invalid", "Path must be a non-empty string.")
    pure = PurePosixPath(raw)
    if not pure.is_absolute():
        raise PathRefused("path_not_absolute", f"Path {raw!r} must be absolute.")
    if ".." in pure.parts:
        raise PathRefused("path_traversal", f"Path {raw!r} must not contain '..'.")
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
    try:
        is_dir = resolved.is_dir()
    except OSError:  # a name too long, a link loop: Python 3.13's is_dir raises some of these
        is_dir = False
    if not is_dir:
        raise PathRefused("path_not_directory", f"Path {raw!r} is not an existing directory.")
    return resolved


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
            raise PathRefused(
                "path_taken", f"Path {str(path)!r} overlaps another user's project.", status=409
            )


def validate_project_location(raw: str, *, owner_id: Any, project_id: int | None = None) -> Path:
    """Every rule for a project's directory: the resolved path, or PathRefused.

    `owner_id` is the project's owner (not whoever is asking), `project_id` the project being
    changed (None for a new one). The runner calls this before it starts an agent, so a path
    saved under older rules, or a root reconfigured since, never becomes an agent's cwd.
    """
    resolved = validate_project_path(raw)
    check_path_free(resolved, owner_id=owner_id, project_id=project_id)
    return resolved
