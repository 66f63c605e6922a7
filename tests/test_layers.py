"""The import arrows point down: api/consumers → actions → models, never from the runner or
the domain up to the site, the API, views or socket consumers (README, "How it is built")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# The web edge: what only the site, its API routers, pages and socket consumers may import.
EDGE = ("hermesweb", "runs.live", "runs.api", "projects.api", "intents.api", "runs.admin", "projects.admin")

# Domain actions and models, and the runner: they reach the rest through domain actions only.
LOWER = [
    "projects/models.py",
    "projects/services.py",
    "projects/paths.py",
    "projects/prompts.py",
    "intents/models.py",
    "intents/services.py",
    "intents/previews.py",
    "runs/models.py",
    "runs/services.py",
    "runs/controls.py",
    *sorted(str(p.relative_to(REPO)) for p in (REPO / "runs" / "journal").glob("*.py")),
    "runs/turns.py",
    "runs/transcript.py",
    "runs/discovery.py",
    "runs/notify.py",
    "runs/export.py",
    "runs/search.py",
    "runs/redaction.py",
    "runs/agents.py",
    "runs/markdown.py",
    "runs/pgcheck.py",
    *sorted(str(p.relative_to(REPO)) for p in (REPO / "runs" / "runner").glob("*.py")),
]


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


@pytest.mark.parametrize("module", LOWER)
def test_the_domain_and_the_runner_import_nothing_of_the_web_edge(module: str) -> None:
    path = REPO / module
    if not path.exists():
        pytest.skip(f"{module} does not exist")
    upward = sorted(
        name for name in imported_modules(path) if any(name == e or name.startswith(e + ".") for e in EDGE)
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
