"""Run the real Hermes Agent (`hermes-acp`) offline against a ScriptedLLM.

Hermes lives in its own virtualenv (see ``bin/setup-hermes``) because it pins an older ACP SDK than
the workbench. Each test gets its own ``HERMES_HOME`` and ``HOME`` so sessions, config and logs of
one test never leak into another, nor into the developer's real ``~/.hermes``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any, TypedDict
from urllib.parse import urlsplit

from tests.support.scripted_llm import ScriptedLLM

REPO_ROOT = Path(__file__).resolve().parents[2]
SETUP_SCRIPT = REPO_ROOT / "bin" / "setup-hermes"
# A cold `pip install` takes ~15 s; leave room for a slow mirror.
SETUP_TIMEOUT = 900.0

_setup_lock = threading.Lock()


class AgentConfig(TypedDict):
    command: str
    args: list[str]
    env: dict[str, str]


def hermes_venv() -> Path:
    venv = Path(os.environ.get("HERMESWEB_HERMES_VENV", ".venv-hermes"))
    return venv if venv.is_absolute() else REPO_ROOT / venv


def hermes_acp_path() -> Path | None:
    """The hermes-acp executable, or None when it is not installed yet.

    ``HERMESWEB_HERMES_ACP`` overrides the venv lookup (e.g. a system-wide install).
    """
    override = os.environ.get("HERMESWEB_HERMES_ACP")
    if override:
        path = Path(override)
        if not path.is_absolute():
            found = shutil.which(override)
            path = Path(found) if found else REPO_ROOT / path
        return path if path.is_file() and os.access(path, os.X_OK) else None
    path = hermes_venv() / "bin" / "hermes-acp"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def ensure_hermes_acp() -> Path:
    """Return hermes-acp, running bin/setup-hermes first if it is missing.

    Raises RuntimeError carrying the setup output, so a broken install fails the test loudly instead
    of silently skipping the only tests that exercise the real agent.
    """
    with _setup_lock:
        path = hermes_acp_path()
        if path is not None:
            return path
        if os.environ.get("HERMESWEB_HERMES_ACP"):
            raise RuntimeError(
                f"HERMESWEB_HERMES_ACP={os.environ['HERMESWEB_HERMES_ACP']!r} is not an executable file"
            )
        try:
            result = subprocess.run(
                ["bash", str(SETUP_SCRIPT)],
                cwd=REPO_ROOT,
                capture_output=True,
                text=True,
                timeout=SETUP_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"bin/setup-hermes timed out after {SETUP_TIMEOUT}s:\n{exc.output}") from exc
        path = hermes_acp_path()
        if result.returncode != 0 or path is None:
            raise RuntimeError(
                f"bin/setup-hermes failed (exit {result.returncode}):\n"
                f"--- stdout ---\n{result.stdout}\n--- stderr ---\n{result.stderr}"
            )
        return path


def hermes_config_yaml(base_url: str, *, approvals_mode: str = "manual", model: str = "mock-model") -> str:
    # Each setting keeps Hermes offline and quiet; see docs/hermes-harness.md.
    return (
        "model:\n"
        "  provider: custom\n"
        f"  default: {model}\n"
        f"  base_url: {base_url}\n"
        "  api_key: mock-key\n"
        "  context_length: 65536\n"
        "security: {tirith_enabled: false}\n"
        "memory: {nudge_interval: 0}\n"
        "skills: {creation_nudge_interval: 0}\n"
        # The toolchain probe runs five Pythons (two of them `pip --version`): ~1 s of CPU at
        # every Hermes start, for a system-prompt hint about pip that no test reads.
        "agent: {environment_probe: false}\n"
        f"approvals: {{mode: {approvals_mode}}}\n"
    )


def write_hermes_home(
    root: Path, llm: ScriptedLLM | str, *, approvals_mode: str = "manual"
) -> tuple[Path, Path]:
    """Create ``root/hermes-home`` (with config.yaml) and ``root/home``; return both."""
    base_url = llm if isinstance(llm, str) else llm.base_url
    hermes_home = root / "hermes-home"
    home = root / "home"
    hermes_home.mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    (hermes_home / "config.yaml").write_text(hermes_config_yaml(base_url, approvals_mode=approvals_mode))
    return hermes_home, home


def hermes_agent_config(
    root: Path,
    llm: ScriptedLLM | str,
    *,
    command: Path | None = None,
    approvals_mode: str = "manual",
    extra_env: dict[str, str] | None = None,
) -> AgentConfig:
    """The workbench's agent config for a real Hermes talking to ``llm``.

    ``command`` defaults to the installed hermes-acp (installing it if needed).
    """
    hermes_home, home = write_hermes_home(root, llm, approvals_mode=approvals_mode)
    executable = command if command is not None else ensure_hermes_acp()
    env = {"HERMES_HOME": str(hermes_home), "HOME": str(home)}
    if extra_env:
        env.update(extra_env)
    # The sandbox lets an agent reach only public addresses unless its entry lists more: the
    # scripted model server is on loopback, as a deployment's local model server would be.
    model = urlsplit(llm if isinstance(llm, str) else llm.base_url)
    network = [f"{model.hostname}:{model.port}"]
    return {"command": str(Path(executable).resolve()), "args": [], "env": env, "network": network}


def spawn_kwargs(config: AgentConfig | dict[str, Any], stderr: Any) -> dict[str, Any]:
    """Keyword arguments for ``acp.spawn_agent_process`` (besides client and command)."""
    # stderr goes to a file: an unread pipe fills up and blocks Hermes. Hermes emits long
    # JSON-RPC lines (history replay), hence the 16 MiB reader limit.
    return {
        "env": dict(config["env"]),
        "transport_kwargs": {"stderr": stderr, "limit": 16 * 1024 * 1024},
        "use_unstable_protocol": True,
    }


__all__ = [
    "REPO_ROOT",
    "AgentConfig",
    "ensure_hermes_acp",
    "hermes_acp_path",
    "hermes_agent_config",
    "hermes_config_yaml",
    "hermes_venv",
    "spawn_kwargs",
    "write_hermes_home",
]
