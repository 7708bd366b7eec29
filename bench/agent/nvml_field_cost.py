"""What each NVML field value costs to read on this GPU: the agent reads them all in one
``nvmlDeviceGetFieldValues`` call per GPU per cycle, and on an H200 (driver 580) that call was
most of a cycle's ~9 ms. This times each field id alone, the agent's batch, and the batch without
each id, so the slow ones can be read less often.

    python3 bench/agent/nvml_field_cost.py [--reps 20]

Needs nvidia-ml-py and a GPU; reads from the agent only its FIELD_VALUES table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    import pynvml as p

    from gpufleet.agent.sources.nvml import FIELD_VALUES

    p.nvmlInit()
    h = p.nvmlDeviceGetHandleByIndex(0)

    def cost(ids: list[int]) -> tuple[float, list[int]]:
        times, rets = [], []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            res = p.nvmlDeviceGetFieldValues(h, ids)
            times.append(time.perf_counter() - t0)
            rets = [int(r.nvmlReturn) for r in res]
        return statistics.median(times) * 1e3, rets

    every = list(FIELD_VALUES)
    full, _ = cost(every)
    print(f"the agent's batch of {len(every)} ids: {full:.3f} ms (median of {args.reps})")
    print(f"{'id':>4} {'field':<22} {'alone ms':>9} {'batch without it ms':>20} return")
    for fid in every:
        alone, rets = cost([fid])
        without, _ = cost([x for x in every if x != fid])
        print(f"{fid:>4} {FIELD_VALUES[fid][0]:<22} {alone:9.3f} {without:20.3f} {rets[0]}")
    for name, fn in (("utilization", lambda: p.nvmlDeviceGetUtilizationRates(h)),
                     ("power", lambda: p.nvmlDeviceGetPowerUsage(h)),
                     ("energy (direct call)", lambda: p.nvmlDeviceGetTotalEnergyConsumption(h)),
                     ("memory v2", lambda: p.nvmlDeviceGetMemoryInfo(h, version=p.nvmlMemory_v2)),
                     ("ecc volatile (direct)", lambda: p.nvmlDeviceGetTotalEccErrors(h, 0, 0))):
        times = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            try:
                fn()
            except p.NVMLError as e:
                print(f"{name}: {e}")
                break
            times.append(time.perf_counter() - t0)
        if times:
            print(f"{name:<24} {statistics.median(times) * 1e3:9.3f} ms")
    p.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
