"""Typed readers for settings that come from the environment.

Every reader fails loudly with ImproperlyConfigured naming the variable, so a
typo in a deployment stops the process at start instead of misbehaving later.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "", environ: Mapping[str, str] = os.environ) -> str:
    return environ.get(name, default)


def env_bool(name: str, default: bool = False, environ: Mapping[str, str] = os.environ) -> bool:
    raw = environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false, yes/no, on/off), got {raw!r}")


def env_float(
    name: str, default: float, *, minimum: float = 0.0, environ: Mapping[str, str] = os.environ
) -> float:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, got {raw!r}") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be ≥ {minimum}, got {raw!r}")
    return value


def env_int(name: str, default: int, *, minimum: int = 0, environ: Mapping[str, str] = os.environ) -> int:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be ≥ {minimum}, got {raw!r}")
    return value


def env_list(name: str, default: list[str], environ: Mapping[str, str] = os.environ) -> list[str]:
    """Comma-separated items. Only commas: `:` belongs to origins (`https://h:8443`) and `[::1]`."""
    raw = environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


# A web origin: (scheme, lower-case host without brackets, port with the scheme's default filled in).
Origin = tuple[str, str, int]
_DEFAULT_PORTS = {"http": 80, "https": 443}


def parse_origin(value: str) -> Origin | None:
    """`scheme://host[:port]` as a comparable triple, or None for anything else (paths, `null`)."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    if (
        parts.scheme not in _DEFAULT_PORTS
        or not parts.hostname
        or "@" in parts.netloc
        or parts.path
        or parts.query
        or parts.fragment
    ):
        return None
    return parts.scheme, parts.hostname, port or _DEFAULT_PORTS[parts.scheme]


def env_origins(name: str, environ: Mapping[str, str] = os.environ) -> list[str]:
    """Comma-separated full origins (`https://host[:port]`), or `*`; anything else is refused."""
    origins = env_list(name, [], environ)
    for origin in origins:
        if origin != "*" and parse_origin(origin) is None:
            raise ImproperlyConfigured(f"{name}: {origin!r} is not an origin like https://host[:port]")
    return origins


def env_roots(name: str, default: list[Path], environ: Mapping[str, str] = os.environ) -> list[Path]:
    """Allowed project roots: absolute, existing directories, stored resolved."""
    raw = environ.get(name)
    candidates = default if raw is None else [Path(p) for p in env_list(name, [], environ)]
    if not candidates:
        raise ImproperlyConfigured(f"{name} must name at least one directory")
    roots: list[Path] = []
    for path in candidates:
        if not path.is_absolute():
            raise ImproperlyConfigured(f"{name}: {str(path)!r} is not an absolute path")
        if not path.is_dir():
            raise ImproperlyConfigured(f"{name}: {str(path)!r} is not an existing directory")
        roots.append(path.resolve())
    return roots


def check_data_dir_outside_roots(data_dir: Path, roots: list[Path]) -> None:
    """ImproperlyConfigured when the data directory (database, secret key, initial password) lies
    inside an allowed project root, where a project's agent would see it."""
    data = data_dir.resolve()
    for root in roots:
        if data == root or data.is_relative_to(root):
            raise ImproperlyConfigured(
                f"HERMESWEB_DATA_DIR ({data}) must not lie inside an allowed root of "
                f"HERMESWEB_ALLOWED_ROOTS ({root}): a project there could read the database and keys"
            )
