#!/usr/bin/env bash
# The type checker (mypy), as scripts/test.sh and CI run it. The repository keeps the design's
# top-level folders (agent/, collector/, ...) that setup.py maps onto gpufleet.agent,
# gpufleet.collector, ...; mypy resolves imports by path, so it checks a tree of symlinks shaped
# like the installed package (built fresh in a temp dir; nothing in the checkout changes).
# Config: pyproject.toml [tool.mypy] (strict on core, collector, storage, analysis).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PY:-$REPO/.venv/bin/python}"
TREE="$(mktemp -d "${TMPDIR:-/tmp}/gpufleet-mypy.XXXXXX")"
trap 'rm -rf "$TREE"' EXIT
mkdir -p "$TREE/gpufleet"
for entry in "$REPO"/gpufleet/*; do ln -s "$entry" "$TREE/gpufleet/$(basename "$entry")"; done
for part in agent collector storage analysis alerts api migrations; do ln -s "$REPO/$part" "$TREE/gpufleet/$part"; done
cd "$TREE"
"$PY" -m mypy --config-file "${MYPY_CONFIG:-$REPO/pyproject.toml}" --cache-dir "$REPO/.mypy_cache" "$@" gpufleet
