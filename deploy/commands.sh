#!/bin/sh
# The command lines of hermesweb's processes, in one place. The systemd units (deploy/systemd/)
# exec this script, and tests/test_scaleout.py starts its web and runner processes through it,
# so what the tests prove is what an operator runs. `exec` keeps the pid: systemd (and a test)
# signals daphne or the runner itself, not a shell.
#
#   commands.sh web PORT       one daphne on $HERMESWEB_WEB_BIND:PORT  (hermesweb-web@PORT.service)
#   commands.sh runner [ARGS]  one runner; its id is host-pid-random   (hermesweb-runner@N.service)
#   commands.sh migrate        apply the database migrations (once per release, before restarts)
#   commands.sh collectstatic  copy the static files to $HERMESWEB_STATIC_ROOT (for nginx)
#   commands.sh doctor         check database, channel layer, agents, roots and runners
#   commands.sh manage ARGS    any other management command (create_token, reap_stale_runs, …)
#
# Where things are (defaults suit the layout of docs/deploy.md):
#   HERMESWEB_APP_DIR   the release's checkout          (default: this script's parent directory)
#   HERMESWEB_PYTHON    the virtualenv's python         (default: /srv/hermesweb/venv/bin/python,
#                                                        else $HERMESWEB_APP_DIR/.venv/bin/python)
#   HERMESWEB_WEB_BIND  the address daphne listens on   (default: 127.0.0.1; a private address
#                                                        when nginx runs on another host)
#   HERMESWEB_ENV_FILE  read first when set, for use by hand; the units use EnvironmentFile=
set -eu

APP_DIR="${HERMESWEB_APP_DIR:-$(cd "$(dirname "$0")/.." && pwd)}"
if [ -n "${HERMESWEB_ENV_FILE:-}" ]; then
  set -a
  # shellcheck disable=SC1090
  . "$HERMESWEB_ENV_FILE"
  set +a
fi
if [ -z "${HERMESWEB_PYTHON:-}" ]; then
  if [ -x /srv/hermesweb/venv/bin/python ]; then
    HERMESWEB_PYTHON=/srv/hermesweb/venv/bin/python
  else
    HERMESWEB_PYTHON="$APP_DIR/.venv/bin/python"
  fi
fi
PYTHON="$HERMESWEB_PYTHON"
cd "$APP_DIR"
export DJANGO_SETTINGS_MODULE=hermesweb.settings PYTHONUNBUFFERED=1

usage() {
  sed -n '7,12p' "$0" >&2
  exit 64
}

verb="${1:-}"
[ $# -gt 0 ] && shift
case "$verb" in
  web)
    [ $# -eq 1 ] || usage
    # --proxy-headers: the client address (login throttling, logs) and scheme come from nginx's
    # X-Forwarded-For / X-Forwarded-Proto, which nginx overwrites (deploy/nginx/hermesweb.conf).
    exec "$PYTHON" -m daphne --bind "${HERMESWEB_WEB_BIND:-127.0.0.1}" --port "$1" --proxy-headers \
      hermesweb.asgi:application
    ;;
  runner)
    # No --id: a runner registers its id once (runs.models.Runner); a restarted process under a
    # fixed id would collide with its predecessor's row. The default is host-pid-random.
    exec "$PYTHON" manage.py runner "$@"
    ;;
  migrate)
    exec "$PYTHON" manage.py migrate --noinput
    ;;
  collectstatic)
    exec "$PYTHON" manage.py collectstatic --noinput --clear -v0
    ;;
  doctor)
    exec "$PYTHON" manage.py doctor "$@"
    ;;
  manage)
    exec "$PYTHON" manage.py "$@"
    ;;
  *)
    usage
    ;;
esac
