#!/usr/bin/env bash
# A real training job on a real GPU node, seen both ways: the agent samples the GPU (NVML, GPM)
# and relays what the job says about itself (gpufleet.progress), while the job writes its own
# clock and FLOP count to truth.jsonl. Written for a bare GPU box (see real_gpu_session.sh: no
# install; msgspec/zstandard wheels from .whl/ when the box has no package index).
#
#   OUT=/tmp/gf-real-train bash bench/agent/real_gpu_training.sh
#
# Leaves in $OUT: log.txt, truth.jsonl (examples/progress/train_gpu.py --truth), smi.csv
# (nvidia-smi at 1 Hz) and spool.tgz (the agent's batches, its collector unreachable on purpose:
# replay them with bench/agent/replay_spool.py). For a dry run without a GPU:
#   AGENT_ARGS="--simulate 1 --gpus-per-node 1" TRAIN_ARGS="--device cpu --layers 2 --hidden 128 --heads 4 --seq 64 --vocab 1000" bash ...
set -u
OUT=${OUT:-/tmp/gf-real-train}
AGENT_ARGS=${AGENT_ARGS:---source nvml}
TRAIN_ARGS=${TRAIN_ARGS:-}
SECONDS_TRAIN=${SECONDS_TRAIN:-75}
PY=${PY:-python3}  # the python that has torch (and nvidia-ml-py)
# shellcheck source=bench/agent/gpu_box_env.sh
source bench/agent/gpu_box_env.sh
# the agent's progress socket: /run/gpufleet when root, else the per-user fallback both sides find
rm -rf /tmp/gf-spool /tmp/gf-train-gpu

step "agent + training for ${SECONDS_TRAIN} s"
smi=
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=timestamp,index,utilization.gpu,power.draw,clocks.sm,memory.used \
    --format=csv,nounits -l 1 > "$OUT/smi.csv" &
  smi=$!
fi
# shellcheck disable=SC2086 # AGENT_ARGS is a list of flags
(cd /tmp && exec "$PY" -m gpufleet.cli agent $AGENT_ARGS --node real-gpu --collector http://127.0.0.1:9 \
  --spool-dir /tmp/gf-spool) &
agent=$!
sleep 3
# shellcheck disable=SC2086
(cd /tmp && timeout $((SECONDS_TRAIN + 120)) "$PY" "$here/examples/progress/train_gpu.py" \
  --seconds "$SECONDS_TRAIN" --truth "$OUT/truth.jsonl" $TRAIN_ARGS)
echo "training exit $?"
sleep 12  # one more flush: the last progress windows close and join a batch
kill -TERM $agent; wait $agent; echo "agent exit $?"
[ -n "$smi" ] && kill $smi && wait $smi 2>/dev/null
ls -la /tmp/gf-spool/queue | tail -5
tar czf "$OUT/spool.tgz" -C /tmp gf-spool
grep -c '"ev": "step"' "$OUT/truth.jsonl"; grep '"ev": "model"\|checkpoint_save\|"ev": "end"' "$OUT/truth.jsonl"
step "done"
ls -la "$OUT"
