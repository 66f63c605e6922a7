"""Settings from the environment: a bad value stops the process with ImproperlyConfigured naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from hermesweb.env import env_bool, env_float, env_int, env_list, env_roots, env_str
from runs.agents import load_agents

REPO = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------- the readers


@pytest.mark.parametrize(
    ("raw", "value"), [("1", True), ("Yes", True), (" on ", True), ("0", False), ("", False)]
)
def test_env_bool_reads_the_usual_spellings(raw: str, value: bool) -> None:
    assert env_bool("FLAG", default=not value, environ={"FLAG": raw}) is value


def test_env_bool_falls_back_to_the_default_when_unset() -> None:
    assert env_bool("FLAG", True, environ={}) is True


def test_env_bool_names_the_variable_for_a_bad_value() -> None:
    with pytest.raises(ImproperlyConfigured, match=r"FLAG must be a boolean.*'maybe'"):
        env_bool("FLAG", environ={"FLAG": "maybe"})


def test_env_float_and_int_parse_and_enforce_their_minimum() -> None:
    assert env_float("F", 1.0, environ={"F": "2.5"}) == 2.5
    assert env_float("F", 1.0, environ={"F": " "}) == 1.0
    assert env_int("I", 3, environ={"I": "7"}) == 7
    with pytest.raises(ImproperlyConfigured, match="F must be a number"):
        env_float("F", 1.0, environ={"F": "fast"})
    with pytest.raises(ImproperlyConfigured, match=r"F must be ≥ 1\.0"):
        env_float("F", 1.0, minimum=1.0, environ={"F": "0.5"})
    with pytest.raises(ImproperlyConfigured, match="I must be an integer"):
        env_int("I", 3, environ={"I": "1.5"})
    with pytest.raises(ImproperlyConfigured, match="I must be ≥ 1"):
        env_int("I", 3, minimum=1, environ={"I": "0"})


def test_env_list_splits_on_commas_only() -> None:
    # `:` is part of origins and IPv6 hosts: splitting on it broke `https://…` and `[::1]`.
    assert env_list("L", [], environ={"L": "a, https://h:8443,,[::1]"}) == ["a", "https://h:8443", "[::1]"]
    assert env_list("L", ["d"], environ={}) == ["d"]
    assert env_str("S", "x", environ={}) == "x"


def test_env_roots_resolves_existing_absolute_directories(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")

    assert env_roots("R", [], environ={"R": str(tmp_path / "link")}) == [(tmp_path / "real").resolve()]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("relative/dir", "not an absolute path"),
        ("/no/such/dir", "not an existing directory"),
        (",", "at least one"),
    ],
)
def test_env_roots_names_the_variable_for_a_bad_root(raw: str, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=f"R.*{message}"):
        env_roots("R", [], environ={"R": raw})


def test_agents_are_built_in_and_overridable_by_json(tmp_path: Path) -> None:
    agents = load_agents(
        tmp_path, environ={"HERMESWEB_AGENTS": '{"mine": {"command": "/bin/true", "args": ["-x"]}}'}
    )

    assert {"demo", "hermes", "mine"} <= set(agents)
    assert agents["mine"].args == ["-x"]


@pytest.mark.parametrize(
    "environ",
    [
        {"HERMESWEB_AGENTS": "{bad"},
        {"HERMESWEB_AGENTS": "[1]"},
        {"HERMESWEB_AGENTS": '{"x": {"command": ""}}'},
        {"HERMESWEB_AGENTS": '{"x": {"command": "a", "args": "b"}}'},
        {"HERMESWEB_AGENTS": '{"x": {"command": "a", "steer": "shout"}}'},
        {"HERMESWEB_AGENTS_FILE": "/no/such/agents.toml"},
    ],
)
def test_a_bad_agent_configuration_names_its_variable(tmp_path: Path, environ: dict[str, str]) -> None:
    with pytest.raises(ImproperlyConfigured, match=next(iter(environ))):
        load_agents(tmp_path, environ=environ)


# ---------------------------------------------------------------- the settings module itself


def load_settings(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {
        k: v for k, v in os.environ.items() if not k.startswith(("HERMESWEB_", "DATABASE_URL", "REDIS_URL"))
    }
    base.pop("SECRET_KEY", None)
    base.pop("DEBUG", None)
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=REPO,
        env={
            **base,
            "DJANGO_SETTINGS_MODULE": "hermesweb.settings",
            "HERMESWEB_DATA_DIR": str(tmp_path),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_embedded_default_starts_with_no_configuration(tmp_path: Path) -> None:
    result = load_settings(tmp_path)

    assert result.returncode == 0, result.stderr
    # The generated secret key is kept for the next start, readable only by its owner.
    key = tmp_path / "secret_key"
    assert key.exists()
    assert key.stat().st_mode & 0o077 == 0


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("DEBUG", "maybe"),
        ("DATABASE_URL", "garbage://"),
        ("REDIS_URL", "http://localhost:6379"),
        ("HERMESWEB_ALLOWED_ROOTS", "relative/dir"),
        ("HERMESWEB_LEASE_SECONDS", "soon"),
        ("HERMESWEB_MAX_RUNS_PER_RUNNER", "0"),
        ("HERMESWEB_DEFAULT_AGENT", "nobody"),
        ("HERMESWEB_AGENTS", "{not json"),
    ],
)
def test_a_bad_value_stops_the_settings_naming_the_variable(
    tmp_path: Path, variable: str, value: str
) -> None:
    extra = {"SECRET_KEY": "x"} if variable == "DATABASE_URL" else {}
    result = load_settings(tmp_path, **{variable: value}, **extra)

    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("django.core.exceptions.ImproperlyConfigured")
    assert variable in last_line


def test_a_database_url_without_a_secret_key_is_refused(tmp_path: Path) -> None:
    result = load_settings(tmp_path, DATABASE_URL="postgres://u@localhost/db")

    assert result.returncode != 0
    assert "SECRET_KEY must be set" in result.stderr
