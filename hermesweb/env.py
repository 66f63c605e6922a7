"""Typed readers for settings that come from the environment.

Every reader fails loudly with ImproperlyConfigured naming the variable, so a
typo in a deployment stops the process at start instead of misbehaving later.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

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
    raw = environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.replace(os.pathsep, ",").split(",") if item.strip()]


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
