#!/usr/bin/env bash
# The production smoke test on the built wheel and sdist (scripts/smoke_wheel.py says what it does).
#   bash scripts/smoke_wheel.sh
# Needs PostgreSQL (GPUFLEET_TEST_PG_URL, default the service on 127.0.0.1:5432), Redis
# (GPUFLEET_TEST_REDIS_URL, default redis://127.0.0.1:6379/0), /usr/bin/chromium, and the dev
# virtualenv (.venv, for Playwright); the wheel's own installs go into fresh virtualenvs, from
# the package indexes pip is configured with (local ones work offline).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${GPUFLEET_VENV:-$PWD/.venv}
exec "$VENV/bin/python" scripts/smoke_wheel.py "$@"
