# Sourced by real_gpu_session.sh and real_gpu_training.sh, from the checkout's root: logs to
# $OUT/log.txt, and makes the agent importable on a bare GPU box without installing anything.
# Needs OUT and PY (the python that has torch and nvidia-ml-py) set.
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
here=$(pwd)
step() { echo; echo "=== $(date -u +%H:%M:%S) $*"; }

step "python packages"
if compgen -G ".whl/*.whl" >/dev/null; then  # msgspec/zstandard wheels, for a box with no package index
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gf-site .whl/*.whl
fi
# gpufleet's import namespace from the checkout's folders (setup.py's ROOTS; the agent needs two).
# Run `python -m gpufleet.cli` from elsewhere (cd /tmp): in the checkout's root, its gpufleet/
# folder (no agent/ in it) comes first on sys.path.
pkg=/tmp/gf-pkg
rm -rf "$pkg" && mkdir -p "$pkg/gpufleet"
cp -r gpufleet/. "$pkg/gpufleet/" && cp -r agent "$pkg/gpufleet/agent"
export PYTHONPATH="$pkg:/tmp/gf-site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
