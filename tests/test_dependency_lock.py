"""requirements.lock pins every dependency, and the venv holds exactly what it pins."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent


def locked() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep, f"not pinned with ==: {line!r}"
        pins[canonicalize_name(name)] = version
    return pins


def declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(text) for text in project["dependencies"] + project["optional-dependencies"]["test"]]


def test_every_dependency_pyproject_names_is_pinned_in_the_lock_within_its_range() -> None:
    pins = locked()
    for requirement in declared():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not in requirements.lock: run bin/lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"requirements.lock pins {name}=={pins[name]}, outside {requirement}"
        )


def test_the_lock_pins_what_the_venv_has_installed() -> None:
    for name, version in locked().items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = None
        assert installed == version, f"requirements.lock pins {name}=={version}, the venv has {installed}"


def test_what_the_dependencies_need_is_pinned_too() -> None:
    # The closure, not only the named packages: an unpinned transitive dependency drifts.
    pins = locked()
    for requirement in declared():
        dist = metadata.distribution(requirement.name)
        for text in dist.requires or []:
            needed = Requirement(text)
            extras = set(requirement.extras) | {""}
            if needed.marker is not None and not any(needed.marker.evaluate({"extra": e}) for e in extras):
                continue
            assert canonicalize_name(needed.name) in pins, f"{needed.name} ({requirement.name} needs it)"
