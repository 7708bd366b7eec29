"""Run the NVML source (GPM included) against the real GPUs of this machine and print what it
sampled, which fields were not available, and what one cycle costs.

Run on a real H200 (driver 580) on 2026-12-04: docs/real-gpu.md has what it printed. The fake
NVML in tests/support/fake_nvml.py models the same calls. Run it on a GPU node:

    .venv/bin/python bench/agent/nvml_real_gpu.py            # 30 cycles at 1 Hz
    .venv/bin/python bench/agent/nvml_real_gpu.py --quick    # 5 cycles
    .venv/bin/python bench/agent/nvml_real_gpu.py --load     # also keep GPU 0 busy (needs torch)

It exits 0 when NVML answered and every catalog field the GPU supports came back in range;
1 with the reason otherwise; 77 (skip) when there is no NVIDIA driver here.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

IB_FIELDS = {"ib_tx_bytes_s", "ib_rx_bytes_s"}


def _busy_gpu(stop: threading.Event) -> None:
    try:
        import torch
    except ImportError:
        print("--load: torch is not installed; sampling an idle GPU", file=sys.stderr)
        return
    a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
    while not stop.is_set():
        (a @ a).sum().item()


class _Timed:
    """pynvml (or the fake) with every nvml* function timed: which calls a cycle's cost is."""

    def __init__(self, module: object | None) -> None:
        if module is None:
            import pynvml

            module = pynvml
        self._m = module
        self.spent: dict[str, list[float]] = {}

    def __getattr__(self, name: str) -> object:
        f = getattr(self._m, name)
        if not (name.startswith("nvml") and callable(f)):
            return f
        spent = self.spent.setdefault(name, [0.0, 0])

        def timed(*args: object, **kw: object) -> object:
            t0 = time.perf_counter()
            try:
                return f(*args, **kw)
            finally:
                spent[0] += time.perf_counter() - t0
                spent[1] += 1
        return timed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cycles", type=int)
    ap.add_argument("--load", action="store_true", help="run a bf16 matmul loop on GPU 0 while sampling")
    ap.add_argument("--fake", action="store_true",
                    help="use the fake NVML (2 x H100, 1 x A100 with MIG): checks this script, not a GPU")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between cycles (default 1)")
    args = ap.parse_args()
    cycles = args.cycles or (5 if args.quick else 30)

    from gpufleet.agent.sources.nvml import NvmlSource, NvmlUnavailable
    from gpufleet.catalog import CATALOG

    module = None
    if args.fake:
        # The fake NVML is test scaffolding (tests/support), not part of the product.
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from tests.support.fake_nvml import FakeNvml, a100, h100

        module = FakeNvml([h100(0), h100(1), a100(2, mig=True)])
    timing = _Timed(module)
    src = NvmlSource(timing)
    try:
        devices = src.devices()
    except NvmlUnavailable as e:
        print(f"skip: {e}")
        return 77
    print(f"{len(devices)} devices:")
    for d in devices:
        print(f"  {d.index}  {d.uuid}  {d.model}  mig={d.mig_profile}  mem={d.memory_total_bytes}")
    gpm = [d.info.uuid for d in src._devices() if d.gpm]
    print(f"GPM supported on {len(gpm)} of {len(devices)}")

    stop = threading.Event()
    loader = threading.Thread(target=_busy_gpu, args=(stop,), daemon=True)
    if args.load:
        loader.start()
        time.sleep(3)

    costs, calls = [], []
    last = []
    seen: dict[str, set[str]] = {}  # fields each GPU gave in any cycle (some are read every 10 s)
    try:
        for _ in range(cycles):
            # this thread's CPU only: with --load, the matrix-product thread shares the process
            t0 = time.thread_time()
            c0, w0 = src.nvml.calls, time.perf_counter()
            last = src.read(time.time())
            for r in last:
                seen.setdefault(r.uuid, set()).update(r.values)
            wall = time.perf_counter() - w0
            costs.append((wall, time.thread_time() - t0))
            calls.append(src.nvml.calls - c0)
            time.sleep(max(0.0, args.interval - wall))
    finally:
        stop.set()
    events = src.drain_events()
    src.close()

    problems = []
    for r in last:
        missing = sorted(set(CATALOG.names) - IB_FIELDS - seen.get(r.uuid, set()))
        print(f"\n{r.uuid}: {len(r.values)} fields, pids={list(r.pids)}")
        for name in CATALOG.names:
            if name in r.values:
                f = CATALOG[name]
                bad = f.check(r.values[name])
                print(f"  {name:<22} {r.values[name]:>16.4f} {f.unit}{'   <-- ' + bad if bad else ''}")
                if bad:
                    problems.append(bad)
        print(f"  not available in any cycle: {', '.join(missing) or '-'}")
    steady = costs[2:] or costs
    wall_ms = sum(w for w, _ in steady) / len(steady) * 1000
    cpu_ms = sum(c for _, c in steady) / len(steady) * 1000
    print(f"\nper cycle over {len(steady)} steady cycles: wall {wall_ms:.2f} ms, CPU {cpu_ms:.2f} ms "
          f"({cpu_ms / 10:.3f}% of one core at 1 Hz), {sum(calls[2:] or calls) / len(steady):.0f} NVML calls, "
          f"{src.errors} NVML errors")
    print(f"events: {[(e.kind, e.code) for e in events]}")
    print("NVML time by call over the whole run (discovery included):")
    for name, (secs, n) in sorted(timing.spent.items(), key=lambda kv: -kv[1][0]):
        print(f"  {name:<44} {n:>5} calls  {secs / max(n, 1) * 1e3:8.3f} ms each  {secs * 1e3:9.1f} ms total")
    if not last:
        problems.append("no GPU answered")
    if problems:
        print("PROBLEMS:\n  " + "\n  ".join(problems))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
