"""Codex and Claude, offline: their entries pointed at a ScriptedLLM on the host's loopback.

The agents come from bin/setup-agents (agents/package-lock.json, cached between runs). Each
entry lists the scripted server as its only network (`network = ["127.0.0.1:<port>"]`), so the
runner's proxy refuses — and counts on the run, and logs — any other connection the agent tries:
a test proves nothing left by finding no refusal. The operator's home (config.toml for Codex,
settings.json for Claude) is written under the test's tmp_path; the runner copies it into the
user's own home (runs/agent_homes.py), as it would an operator's.
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path
from typing import Any

from tests.support.scripted_llm import ScriptedLLM

REPO_ROOT = Path(__file__).resolve().parents[2]
SETUP_SCRIPT = REPO_ROOT / "bin" / "setup-agents"
# A cold `npm ci` of ~750 MB took 29 s here; leave room for a slow registry.
SETUP_TIMEOUT = 1200.0
# Claude's cheap side calls (titles) name this model: not the script's.
SIDE_MODEL = "mock-small"
API_KEY = "mock-key"

_setup_lock = threading.Lock()


def agents_bin() -> Path:
    """node_modules/.bin with codex-acp and claude-agent-acp, installing them first if needed.

    Raises RuntimeError with the script's output: a broken install fails loudly, never skips.
    """
    with _setup_lock:
        result = subprocess.run(
            ["bash", str(SETUP_SCRIPT)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=SETUP_TIMEOUT,
            check=False,
        )
    if result.returncode != 0:
        output = f"{result.stdout}\n{result.stderr}"
        raise RuntimeError(f"bin/setup-agents failed ({result.returncode}):\n{output}")
    return Path(result.stdout.strip().splitlines()[-1])


def codex_config_toml(llm: ScriptedLLM) -> str:
    """The operator's config.toml for Codex against the scripted server (the README's shape)."""
    return f"""model = "{llm.model}"
model_provider = "scripted"

[model_providers.scripted]
name = "Scripted model"
base_url = "{llm.base_url}"
wire_api = "responses"
env_key = "SCRIPTED_API_KEY"
"""


def codex_entry(root: Path, llm: ScriptedLLM, bin_dir: Path) -> dict[str, Any]:
    home = root / "operator-codex"
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(codex_config_toml(llm))
    return {
        "command": str(bin_dir / "codex-acp"),
        "args": [],
        "env": {"CODEX_HOME": str(home), "SCRIPTED_API_KEY": API_KEY},
        "network": [f"127.0.0.1:{llm.port}"],
    }


def claude_entry(root: Path, llm: ScriptedLLM, bin_dir: Path) -> dict[str, Any]:
    home = root / "operator-claude"
    home.mkdir(parents=True, exist_ok=True)
    return {
        "command": str(bin_dir / "claude-agent-acp"),
        "args": [],
        "env": {
            "CLAUDE_CONFIG_DIR": str(home),
            "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{llm.port}",
            "ANTHROPIC_API_KEY": API_KEY,
            "ANTHROPIC_MODEL": llm.model,
            "ANTHROPIC_SMALL_FAST_MODEL": SIDE_MODEL,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": SIDE_MODEL,
        },
        "network": [f"127.0.0.1:{llm.port}"],
    }


def entry_for(name: str, root: Path, llm: ScriptedLLM, bin_dir: Path) -> dict[str, Any]:
    return (codex_entry if name == "codex" else claude_entry)(root, llm, bin_dir)


# What each agent calls its shell tool, and the arguments that run `command` with it.
def shell_call(agent: str, command: str, *, escalate: bool = False) -> tuple[str, dict[str, Any]]:
    if agent == "codex":
        arguments: dict[str, Any] = {"cmd": command}
        if escalate:
            # Codex asks the user only for a command that asks to leave its sandbox.
            arguments |= {"sandbox_permissions": "require_escalated", "justification": "the user asked"}
        return "exec_command", arguments
    return "Bash", {"command": command, "description": "run a command"}


def installed() -> bool:
    return os.access(REPO_ROOT / "agents" / "node_modules" / ".bin" / "codex-acp", os.X_OK)
