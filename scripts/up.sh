#!/usr/bin/env bash
# The whole system on an embedded default: SQLite, no Redis, simulated fleet (or local GPUs).
#   bash scripts/up.sh [gpufleet up options, e.g. --port 8080 --simulate 32]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${GPUFLEET_VENV:-.venv}
STAMP="$VENV/.gpufleet-installed"
# (Re)install on the first run and whenever pyproject.toml changed since: a venv made before an
# extra gained a package (celery[redis], packaging) would otherwise keep lacking it.
if [ ! -x "$VENV/bin/gpufleet" ] || [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
  echo "[up.sh] installing gpufleet[agent,server] into $VENV"
  [ -x "$VENV/bin/python" ] || ${PYTHON:-python3} -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[agent,server]"
  touch "$STAMP"
fi
exec "$VENV/bin/gpufleet" up "$@"
