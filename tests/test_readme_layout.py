"""The README's layout table names every production module (issue 39, item 9).

A module the table leaves out is one a new engineer cannot find from the README; this fails
with the list of them. Each app's `apps.py` and `schemas.py` are named once for all, under the
table; migrations, management commands and package markers are not modules one looks for.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONVENTIONAL = {"__init__.py", "apps.py", "schemas.py"}


def layout_section() -> str:
    readme = (REPO / "README.md").read_text()
    start = readme.index("### Layout")
    return readme[start : readme.index("\n### ", start + 1)]


def production_modules() -> list[Path]:
    apps = {path.parent for path in REPO.glob("*/apps.py")} | {REPO / "hermesweb"}
    return sorted(
        path.relative_to(REPO)
        for app in apps
        for path in app.rglob("*.py")
        if path.name not in CONVENTIONAL and not {"migrations", "management"} & set(path.parts)
    )


def test_every_production_module_is_in_the_readmes_layout_table() -> None:
    layout = layout_section()
    missing = [
        str(path)
        for path in production_modules()
        if f"`{path.name}`" not in layout and f"`{path.stem}`" not in layout and str(path) not in layout
    ]
    assert not missing, f"add these to README.md's layout table: {missing}"


def test_the_check_sees_the_modules() -> None:
    modules = {str(path) for path in production_modules()}
    assert "runs/runner/sandbox.py" in modules and "hermesweb/settings.py" in modules
    assert not any("migrations" in module for module in modules)
