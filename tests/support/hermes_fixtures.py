"""Pytest fixtures for tests that drive the real Hermes Agent against a ScriptedLLM.

Registered by ``pytest_plugins`` in the root conftest, so every test module can ask for them.
Every test that uses ``hermes_acp_binary`` (directly or through ``hermes_agent_config``) is marked
``hermes``, so ``-m "not hermes"`` leaves the real agent out.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.hermes import AgentConfig, ensure_hermes_acp
from tests.support.hermes import hermes_agent_config as make_agent_config
from tests.support.scripted_llm import ScriptedLLM

HERMES_MARKER = "hermes: drives the real hermes-acp (installed by bin/setup-hermes)"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", HERMES_MARKER)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # tryfirst: the mark must exist before `-m` deselection looks at the items.
    for item in items:
        if "hermes_acp_binary" in getattr(item, "fixturenames", ()):
            item.add_marker("hermes")


@pytest.fixture(scope="session")
def hermes_acp_binary() -> Path:
    """Absolute path of hermes-acp; runs bin/setup-hermes once per session if it is missing.

    Never skips: a failed setup fails the test with the setup output.
    """
    try:
        return ensure_hermes_acp()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def scripted_llm() -> Iterator[ScriptedLLM]:
    """A running ScriptedLLM on 127.0.0.1; stopped after the test."""
    with ScriptedLLM() as llm:
        yield llm


@pytest.fixture
def hermes_workspace(tmp_path: Path) -> Path:
    """An empty directory to use as the session cwd (Hermes runs its tools there)."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    return workspace


@pytest.fixture
def hermes_agent_config(tmp_path: Path, scripted_llm: ScriptedLLM, hermes_acp_binary: Path) -> AgentConfig:
    """``{"command", "args", "env"}`` for a real hermes-acp wired to ``scripted_llm``.

    HERMES_HOME and HOME live under ``tmp_path``; approvals are manual, so dangerous terminal
    commands raise ``session/request_permission``.
    """
    return make_agent_config(tmp_path / "hermes", scripted_llm, command=hermes_acp_binary)
