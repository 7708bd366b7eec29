"""Drive GPU 0 through known phases while an agent samples it, and log when each began and ended,
so the agent's readings can be checked against what the GPU was made to do (not against what
the agent's own code expects).

    python3 bench/agent/gpu_load_phases.py --out phases.jsonl        # needs torch with CUDA

Phases (defaults): idle, a bf16 matrix-product loop (Tensor Cores busy: tensor_active and
sm_active high, DRAM low), a device-to-device copy loop (DRAM bandwidth high, Tensor Cores idle),
idle again. One JSON line per phase: {"phase", "start", "end", ...}; the copy phase also
records the bytes it moved, the product phase the TFLOP/s it reached.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def _matmul(torch: Any, seconds: float) -> dict[str, float]:
    n = 8192
    a = torch.randn(n, n, device="cuda:0", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda:0", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t0, done = time.time(), 0
    while time.time() - t0 < seconds:
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()
        done += 20
    wall = time.time() - t0
    return {"tflops": 2 * n**3 * done / wall / 1e12}


def _copy(torch: Any, seconds: float) -> dict[str, float]:
    src = torch.empty(2 * 1024**3, dtype=torch.uint8, device="cuda:0")  # 2 GiB: far past L2
    dst = torch.empty_like(src)
    torch.cuda.synchronize()
    t0, done = time.time(), 0
    while time.time() - t0 < seconds:
        for _ in range(10):
            dst.copy_(src)
        torch.cuda.synchronize()
        done += 10
    wall = time.time() - t0
    # read + write, the way DRAM sees a copy
    return {"dram_bytes_s": 2 * src.numel() * done / wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--idle", type=float, default=12.0)
    ap.add_argument("--matmul", type=float, default=30.0)
    ap.add_argument("--copy", type=float, default=20.0)
    ap.add_argument("--tail", type=float, default=12.0, help="idle seconds at the end")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("torch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("torch sees no CUDA device", file=sys.stderr)
        return 2
    torch.zeros(1, device="cuda:0")  # context up before the first phase is timed
    with open(args.out, "w") as out:
        def phase(name: str, fn: Any, seconds: float) -> None:
            start = time.time()
            extra = fn(seconds) if fn else time.sleep(seconds) or {}
            row = {"phase": name, "start": start, "end": time.time(), **extra}
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(row, flush=True)

        phase("idle", None, args.idle)
        phase("matmul_bf16", lambda s: _matmul(torch, s), args.matmul)
        torch.cuda.empty_cache()
        phase("copy_d2d", lambda s: _copy(torch, s), args.copy)
        torch.cuda.empty_cache()
        phase("idle_tail", None, args.tail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
