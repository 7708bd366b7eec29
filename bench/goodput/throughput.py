"""Throughput of the pure heuristics: a 10,000-GPU fleet's last hour at 1 Hz on one core.

    .venv/bin/python bench/goodput/throughput.py           # 10,000 GPUs x 3,600 s = 36 M GPU-samples
    .venv/bin/python bench/goodput/throughput.py --quick   # 1,000 GPUs

Jobs of 1-32 GPUs fill the fleet; their samples (every field the engine reads, NaN-free,
float64 as read from the database) are made with numpy up front and are not timed. Timed per
job: raw samples -> per-minute features -> histograms -> windows -> every detector -> report.
Database reads are not included (see docs/benchmarks.md for the runner's figures)."""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

from gpufleet.analysis.config import load_thresholds
from gpufleet.analysis.detectors import features_for
from gpufleet.analysis.features import RAW_FIELDS, histograms
from gpufleet.analysis.report import JobMeta, analyze

SIZES = (1, 2, 4, 8, 8, 16, 32)


def make_arrays(n_gpus: int, seconds: int, rng: np.random.Generator, t0: float) -> tuple[np.ndarray, np.ndarray,
                                                                                          dict[str, np.ndarray]]:
    n = n_gpus * seconds
    # GPU-major, time-ordered: the order the runner reads (ORDER BY gpu_pk, ts).
    ts = np.tile(t0 + np.arange(seconds, dtype=np.float64), n_gpus)
    gpu = np.repeat(np.arange(n_gpus), seconds)
    level = rng.uniform(0.0, 0.95)
    sm = np.clip(level + rng.normal(0, 0.05, n), 0, 1)
    cols = {f: np.clip(rng.normal(0.3, 0.1, n), 0, 1) for f in RAW_FIELDS}
    cols["sm_active"] = sm
    cols["sm_clock_mhz"] = np.where(sm > 0.02, 1980.0, 345.0)
    cols["clock_event_reasons"] = np.where(sm > 0.02, 0.0, 1.0)
    cols["fb_used_bytes"] = np.full(n, 40e9)
    cols["fb_total_bytes"] = np.full(n, 80 * 2**30)
    cols["power_w"] = 100 + 500 * sm
    for f in ("nvlink_tx_bytes_s", "nvlink_rx_bytes_s", "ib_tx_bytes_s", "ib_rx_bytes_s"):
        cols[f] = rng.uniform(0, 2e10, n)
    for f in ("xid_last", "ecc_dbe_volatile", "row_remap_failure", "nvlink_error_count", "pcie_replay_count"):
        cols[f] = np.zeros(n)
    return ts, gpu, cols


def fleet(total_gpus: int, seconds: int, variants: int, rng: np.random.Generator, t0: float
          ) -> tuple[list[int], dict[int, list[tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]]]]:
    """Job sizes (cycling SIZES) adding up to ``total_gpus``, and up to ``variants`` distinct
    sample arrays per size (the jobs of one size reuse them)."""
    sizes: list[int] = []
    i = 0
    while sum(sizes) < total_gpus:
        sizes.append(min(SIZES[i % len(SIZES)], total_gpus - sum(sizes)))
        i += 1
    pool = {s: [make_arrays(s, seconds, rng, t0) for _ in range(min(variants, sizes.count(s)))] for s in set(sizes)}
    return sizes, pool


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1,000 GPUs")
    ap.add_argument("--gpus", type=int, default=10_000)
    ap.add_argument("--seconds", type=int, default=3600)
    ap.add_argument("--variants", type=int, default=24, help="distinct sample arrays per job size (reused)")
    a = ap.parse_args(argv)
    total_gpus = 1000 if a.quick else a.gpus
    th = load_thresholds()
    rng = np.random.default_rng(0)
    t0 = 1_790_000_000.0
    sizes, pool = fleet(total_gpus, a.seconds, a.variants, rng, t0)
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    flags = 0
    t_feat = 0.0
    for j, s in enumerate(sizes):
        ts, gpu, cols = pool[s][j % len(pool[s])]
        f0 = time.perf_counter()
        feats = features_for(th, ts, gpu, cols, s)
        hist = histograms(cols)
        t_feat += time.perf_counter() - f0
        meta = JobMeta(job_id=str(j), start_ts=t0, end_ts=None, running=True,
                       gpu_uuids=[f"GPU-{j}-{k}" for k in range(s)], gpu_nodes=[f"n{j}-{k // 8}" for k in range(s)],
                       gpu_indexes=[k % 8 for k in range(s)], model="NVIDIA H100 80GB HBM3")
        res = analyze(meta, feats, hist, th=th, first_ts=t0, last_ts=t0 + a.seconds - 1)
        flags += len(res.findings)
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    samples = total_gpus * a.seconds
    print(f"fleet: {total_gpus:,} GPUs in {len(sizes):,} jobs, {a.seconds:,} s at 1 Hz = "
          f"{samples / 1e6:.1f} M GPU-samples")
    print(f"analysis: wall {wall:.2f} s, CPU {cpu:.2f} s (one core; goal <= 10 s for 10,000 GPUs)")
    print(f"  of which raw -> minute features + histograms: {t_feat:.2f} s; windows, detectors, report: "
          f"{wall - t_feat:.2f} s")
    print(f"  {samples / wall / 1e6:.1f} M GPU-samples/s; {flags} findings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
