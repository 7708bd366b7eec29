#!/usr/bin/env bash
# The whole system on an embedded default: SQLite, no Redis, simulated fleet (or local GPUs).
#   bash scripts/up.sh [gpufleet up options, e.g. --port 8080 --simulate 32]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${GPUFLEET_VENV:-.venv}
if [ ! -x "$VENV/bin/gpufleet" ]; then
  echo "[up.sh] installing gpufleet[agent,server] into $VENV (first run only)"
  ${PYTHON:-python3} -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[agent,server]"
fi
exec "$VENV/bin/gpufleet" up "$@"
