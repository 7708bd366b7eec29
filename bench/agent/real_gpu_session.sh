#!/usr/bin/env bash
# One short session on a real NVIDIA GPU node: the agent's NVML and GPM path, end to end, with
# what the GPU was made to do logged beside it. Written for a bare GPU box that has python3,
# torch with CUDA and nvidia-ml-py but not gpufleet: it imports the agent from this checkout
# (no install, no server dependencies) and takes msgspec/zstandard wheels from .whl/ if present.
#
#   OUT=/tmp/gf-real-gpu bash bench/agent/real_gpu_session.sh
#
# Leaves in $OUT (docs/real-gpu.md reads them):
#   log.txt            everything printed: nvidia-smi, nvml_real_gpu.py idle and under load, agent --once
#   nvidia-smi-q.xml   the driver's own view (nvidia-smi -q -x)
#   once.json          agent --once --print --json
#   smi.csv            nvidia-smi --query-gpu at 1 Hz while the agent ran (the independent reading)
#   phases.jsonl       what GPU 0 was made to do, and when (bench/agent/gpu_load_phases.py)
#   agent_metrics.txt  the agent's own /metrics (DCGM names) scraped during the matrix products
#   spool.tgz          the batches the agent made (its collector was unreachable on purpose):
#                      replay them into a real collector with bench/agent/replay_spool.py
set -u
OUT=${OUT:-/tmp/gf-real-gpu}
PY=${PY:-python3}
# shellcheck source=bench/agent/gpu_box_env.sh
source bench/agent/gpu_box_env.sh
python3 - <<'EOF'
import sys, pynvml, torch, msgspec
from importlib.metadata import version
print("python", sys.version.split()[0], "nvidia-ml-py", version("nvidia-ml-py"), "torch", torch.__version__,
      "cuda", torch.cuda.is_available(), "msgspec", msgspec.__version__)
EOF

step "nvidia-smi"
nvidia-smi
nvidia-smi -q -x > "$OUT/nvidia-smi-q.xml"
uname -r

step "raw NVML: memory v1 vs v2, NVLink links, clocks and limits (what the agent's choices rest on)"
nvidia-smi nvlink -s 2>&1 | head -40
python3 - <<'EOF2'
import pynvml as p
p.nvmlInit()
h = p.nvmlDeviceGetHandleByIndex(0)
def ask(name, f):
    try:
        print(f"{name}: {f()}")
    except p.NVMLError as e:
        print(f"{name}: NVMLError {e} ({getattr(e, 'value', '?')})")
m1 = p.nvmlDeviceGetMemoryInfo(h)
print(f"memory v1: total {m1.total} used {m1.used} free {m1.free}")
ask("memory v2", lambda: (lambda m: f"total {m.total} reserved {m.reserved} used {m.used} free {m.free}")(
    p.nvmlDeviceGetMemoryInfo(h, version=p.nvmlMemory_v2)))
for link in range(18):
    ask(f"nvlink {link} state", lambda: p.nvmlDeviceGetNvLinkState(h, link))
for fid, name in ((91, "NVLINK_LINK_COUNT"), (38, "NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"), (138, "NVLINK_THROUGHPUT_DATA_TX"), (197, "PCIE_COUNT_TX_BYTES")):
    fv = p.nvmlDeviceGetFieldValues(h, [fid])[0]
    print(f"field {fid} {name}: return {fv.nvmlReturn} type {fv.valueType} ull {fv.value.ullVal}")
ask("max SM clock", lambda: p.nvmlDeviceGetMaxClockInfo(h, 1))
ask("power limit mW", lambda: p.nvmlDeviceGetEnforcedPowerLimit(h))
ask("gpm support", lambda: p.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
ask("clock event reasons", lambda: hex(p.nvmlDeviceGetCurrentClocksEventReasons(h)))
ask("persistence", lambda: p.nvmlDeviceGetPersistenceMode(h))
ask("compute mode", lambda: p.nvmlDeviceGetComputeMode(h))
p.nvmlShutdown()
EOF2

step "nvml_real_gpu.py, idle GPU"
timeout 90 python3 bench/agent/nvml_real_gpu.py --quick; echo "exit $?"

step "nvml_real_gpu.py, GPU 0 under a bf16 matrix-product loop"
timeout 150 python3 bench/agent/nvml_real_gpu.py --cycles 12 --load; echo "exit $?"

step "gpufleet agent --once --print (table), then --json"
# from /tmp: in the checkout's root, python -m finds its gpufleet/ folder (no agent/ in it) first
cd /tmp
timeout 60 python3 -m gpufleet.cli agent --once --print --source nvml --node real-gpu; echo "exit $?"
timeout 60 python3 -m gpufleet.cli agent --once --print --json --source nvml --node real-gpu > "$OUT/once.json"
echo "exit $?"

step "the agent, 1 Hz, 10 s batches, while GPU 0 goes idle -> matmul -> copy -> idle"
rm -rf /tmp/gf-spool
nvidia-smi --query-gpu=timestamp,index,utilization.gpu,utilization.memory,power.draw,clocks.sm,clocks.mem,memory.used,temperature.gpu,pstate \
  --format=csv,nounits -l 1 > "$OUT/smi.csv" &
smi=$!
# port 9 (discard) refuses: every batch stays in the spool, to be replayed elsewhere
(cd /tmp && exec python3 -m gpufleet.cli agent --source nvml --node real-gpu --collector http://127.0.0.1:9 \
  --spool-dir /tmp/gf-spool --metrics-port 9500 --metrics-dcgm-names) &
agent=$!
cd "$here"
sleep 4
(sleep 32; curl -s http://127.0.0.1:9500/metrics > "$OUT/agent_metrics.txt") &
timeout 150 python3 bench/agent/gpu_load_phases.py --out "$OUT/phases.jsonl"; echo "load exit $?"
sleep 3
kill -TERM $agent; wait $agent; echo "agent exit $?"
kill $smi; wait $smi 2>/dev/null
ls -la /tmp/gf-spool /tmp/gf-spool/* | head -40
tar czf "$OUT/spool.tgz" -C /tmp gf-spool
step "done"
ls -la "$OUT"
