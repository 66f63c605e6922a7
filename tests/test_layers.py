"""The import arrows point down: api/consumers → actions → models, never from the runner or
the domain up to the site, the API, views or socket consumers (README, "How it is built").

The layers come from the package layout, not from a list kept by hand, so a new module or app
is checked the day it lands:
- the web edge is the site package (the one holding `settings.py`), each app's `api.py`,
  `admin.py`, `views.py` and `urls.py`, and each package that routes sockets (`routing.py`);
- everything else in an app (a package with `apps.py`) is below it: domain actions, models, the
  runner. Migrations and management commands are entry points, on top of everything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

EDGE_MODULES = ("api", "admin", "views", "urls")
ENTRY_POINTS = ("migrations", "management")


def app_packages() -> list[Path]:
    return sorted(path.parent for path in REPO.glob("*/apps.py"))


def edge_packages() -> list[Path]:
    """The site, and every package whose sockets are routed from it."""
    site = [app for app in app_packages() if (app / "settings.py").exists()]
    sockets = [path.parent for app in app_packages() for path in app.rglob("routing.py")]
    return site + sockets


def dotted(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def edge() -> tuple[str, ...]:
    names = [dotted(package) for package in edge_packages()]
    names += [f"{dotted(app)}.{name}" for app in app_packages() for name in EDGE_MODULES]
    return tuple(sorted(set(names)))


def lower_modules() -> list[str]:
    """Every module of an app that is neither on the web edge nor an entry point."""
    edge_names = edge()
    found = []
    for app in app_packages():
        for path in app.rglob("*.py"):
            rel = path.relative_to(REPO)
            if any(part in ENTRY_POINTS or part == "__pycache__" for part in rel.parts):
                continue
            name = dotted(path)
            if not any(name == e or name.startswith(e + ".") for e in edge_names):
                found.append(str(rel))
    return sorted(found)


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_layout_gives_both_layers() -> None:
    # A rename that empties either side would make the rule below pass by checking nothing.
    assert {"hermesweb", "runs.live", "runs.api", "projects.api", "intents.api"} <= set(edge())
    lower = set(lower_modules())
    assert {"runs/services.py", "runs/runner/writer.py", "runs/schemas.py", "projects/models.py"} <= lower


@pytest.mark.parametrize("module", lower_modules())
def test_the_domain_and_the_runner_import_nothing_of_the_web_edge(module: str) -> None:
    edge_names = edge()
    upward = sorted(
        name
        for name in imported_modules(REPO / module)
        if any(name == e or name.startswith(e + ".") for e in edge_names)
    )
    assert upward == [], f"{module} imports {upward}"


def test_only_management_commands_import_the_runner() -> None:
    # The web never holds execution: its pages, API and sockets reach the runner only through rows.
    importers = []
    for path in REPO.glob("*/**/*.py"):
        rel = str(path.relative_to(REPO))
        if rel.startswith(("runs/runner/", "tests/", "bench/", ".venv")) or "/management/commands/" in rel:
            continue
        if any(name.startswith("runs.runner") for name in imported_modules(path)):
            importers.append(rel)
    assert importers == [], importers
