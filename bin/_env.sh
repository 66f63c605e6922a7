# Shared set-up for bin/start and bin/test: a virtualenv with Python ≥ 3.12 and
# the project installed. Sourced, not executed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${HERMESWEB_VENV:-$ROOT/.venv}"

find_python() {
  local candidates=()
  [ -n "${HERMESWEB_PYTHON:-}" ] && candidates+=("$HERMESWEB_PYTHON")
  candidates+=(python3.13 python3.12 python3)
  if command -v pyenv >/dev/null 2>&1; then
    local root; root="$(pyenv root)"
    candidates+=("$root"/versions/3.13*/bin/python "$root"/versions/3.12*/bin/python)
  fi
  candidates+=("$HOME"/.pyenv/versions/3.13*/bin/python "$HOME"/.pyenv/versions/3.12*/bin/python)
  for py in "${candidates[@]}"; do
    command -v "$py" >/dev/null 2>&1 || [ -x "$py" ] || continue
    if "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
      echo "$py"; return 0
    fi
  done
  echo "hermesweb needs Python ≥ 3.12 (none found on PATH or under pyenv); set HERMESWEB_PYTHON" >&2
  return 1
}

ensure_venv() {
  if [ ! -x "$VENV/bin/python" ]; then
    local py; py="$(find_python)"
    echo "» creating $VENV with $("$py" --version)"
    "$py" -m venv "$VENV"
  fi
  # Reinstall only when the dependency list or its lock changed.
  local stamp="$VENV/.hermesweb-installed" want
  want="$(cat pyproject.toml requirements.lock | sha256sum | cut -d' ' -f1)"
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "» installing hermesweb and its dependencies into $VENV (requirements.lock)"
    # grep drops pip's noise about this machine's unused local index mirrors.
    "$VENV/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
    # Exactly the locked versions (bin/lock writes them), then the project itself on top.
    "$VENV/bin/python" -m pip install -q -r requirements.lock 2>&1 | grep -v "^WARNING: Location" || true
    "$VENV/bin/python" -m pip install -q --no-deps -e . 2>&1 | grep -v "^WARNING: Location" || true
    "$VENV/bin/python" -c "import django, acp, channels_redis, daphne, playwright" \
      || { echo "installing into $VENV failed" >&2; exit 1; }
    echo "$want" > "$stamp"
  fi
  export PATH="$VENV/bin:$PATH"
}

# Debian's bubblewrap (the agent sandbox, docs/security.md: the suite and the benchmarks run
# every agent inside it) and chromium (the browser tests, the page benchmark).
ensure_system_tools() {
  local packages=""
  [ -x /usr/bin/bwrap ] || packages="bubblewrap"
  [ -x /usr/bin/chromium ] || packages="$packages chromium fonts-liberation fonts-dejavu-core"  # fonts: readable screenshots
  [ -n "$packages" ] || return 0
  echo "» installing Debian's$packages"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq && $sudo apt-get install -y -qq $packages >/dev/null
}
