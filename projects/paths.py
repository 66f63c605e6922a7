"""Project paths are trusted boundaries: the agent runs with the path as cwd."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from django.conf import settings


class PathRefused(ValueError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def allowed_roots() -> list[Path]:
    return list(settings.HERMESWEB_ALLOWED_ROOTS)


def validate_project_path(raw: str) -> Path:
    """Return the resolved directory, or raise PathRefused.

    Refuses relative paths and any `..` component outright (even when it would
    resolve inside a root) and resolves symlinks before the containment check,
    so a link pointing out of the allowed roots is refused.
    """
    if not raw or "\x00" in raw:
        raise PathRefused("path_invalid", "Path must be a non-empty string.")
    pure = PurePosixPath(raw)
    if not pure.is_absolute():
        raise PathRefused("path_not_absolute", f"Path {raw!r} must be absolute.")
    if ".." in pure.parts:
        raise PathRefused("path_traversal", f"Path {raw!r} must not contain '..'.")
    resolved = Path(raw).resolve()
    if not resolved.is_dir():
        raise PathRefused("path_not_directory", f"Path {raw!r} is not an existing directory.")
    roots = allowed_roots()
    if not any(resolved == root or resolved.is_relative_to(root) for root in roots):
        shown = ", ".join(str(r) for r in roots)
        raise PathRefused("path_outside_roots", f"Path {raw!r} is outside the allowed roots ({shown}).")
    return resolved
