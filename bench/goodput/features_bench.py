"""Analysis CPU of a 10,000-GPU fleet's hour: from minute features folded at ingest (what the
runner reads now) against from raw samples (what it read before), side by side, per job,
interleaved in one run, with both reports compared.

    .venv/bin/python bench/goodput/features_bench.py           # 10,000 GPUs x 3,600 s
    .venv/bin/python bench/goodput/features_bench.py --quick   # 1,000 GPUs

Before/after a change to the analysis: run ``--features-only --reports-out FILE`` on each tree
(docs/benchmarks.md shows how to get the older tree), interleaved, and ``cmp`` the two files:
the reports must be byte-identical. The per-job-size lines show the per-job constant cost.

The fleet and its samples are bench/goodput/throughput.py's. Not timed: making the samples and
folding them into states (storage.minute_features.fold: the collector's work at ingest, shown
separately) and the database read (runner_bench.py measures that). Timed per job, CPU of one
core: raw -> features_for + histograms -> analyze, and states -> from_states + hist -> analyze."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import fleet

from gpufleet.analysis.config import load_thresholds
from gpufleet.analysis.detectors import features_for
from gpufleet.analysis.features import HIST_BINS, HIST_FIELDS, READ_COLUMNS, from_states, histograms
from gpufleet.analysis.report import JobMeta, analyze
from gpufleet.storage.minute_features import fold

States = dict[tuple[int, int], tuple[np.ndarray, dict[str, np.ndarray]]]


def fold_pool(pool: dict[int, list[tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]]]) -> States:
    """Each distinct sample set folded as the collector folds it at ingest, read back as the
    runner reads it: (states in READ_COLUMNS order, the job's histograms)."""
    states: States = {}
    for s, variants in pool.items():
        for v, (ts, gpu, cols) in enumerate(variants):
            f = fold(ts, gpu, np.zeros(len(ts), np.int64), cols)
            rows = np.column_stack([{"bucket": f.bucket, "gpu_pk": f.gpu_pk, **f.cols}[c] for c in READ_COLUMNS])
            tot = f.hist.sum(axis=0)
            hist = {name: tot[k * HIST_BINS:(k + 1) * HIST_BINS] for k, name in enumerate(HIST_FIELDS)}
            states[(s, v)] = (rows, hist)
    return states


def job_meta(cls: Any, j: int, s: int, t0: float) -> Any:
    """Job ``j`` of ``s`` GPUs, 8 to a node (``cls``: a JobMeta of this tree or another's)."""
    return cls(job_id=str(j), start_ts=t0, end_ts=None, running=True, gpu_uuids=[f"GPU-{j}-{k}" for k in range(s)],
               gpu_nodes=[f"n{j}-{k // 8}" for k in range(s)], gpu_indexes=[k % 8 for k in range(s)],
               model="NVIDIA H100 80GB HBM3")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1,000 GPUs")
    ap.add_argument("--gpus", type=int, default=10_000)
    ap.add_argument("--seconds", type=int, default=3600)
    ap.add_argument("--variants", type=int, default=24, help="distinct sample arrays per job size (reused)")
    ap.add_argument("--features-only", action="store_true", help="skip the raw-samples reference (A/B of two trees)")
    ap.add_argument("--repeat", type=int, default=1, help="time the features path this many passes (the median counts)")
    ap.add_argument("--reports-out", type=Path, help="write each job's features-path report and flags (JSON lines)")
    a = ap.parse_args(argv)
    total = 1000 if a.quick else a.gpus
    th = load_thresholds()
    rng = np.random.default_rng(0)
    t0 = 1_790_000_000.0
    sizes, pool = fleet(total, a.seconds, a.variants, rng, t0)
    f0 = time.process_time()
    states = fold_pool(pool)
    fold_cpu = time.process_time() - f0
    raw_cpu = feat_cpu = 0.0
    same = 0
    rows_total = 0
    by_size: dict[int, list[float]] = {}
    pass_cpu = [0.0] * max(1, a.repeat)  # the whole fleet's features CPU, per pass
    out = a.reports_out.open("w") if a.reports_out else None
    for j, s in enumerate(sizes):
        v = j % len(pool[s])
        ts, gpu, cols = pool[s][v]
        meta = job_meta(JobMeta, j, s, t0)
        c0 = time.process_time()
        ref = None if a.features_only else analyze(meta, features_for(th, ts, gpu, cols, s), histograms(cols), th=th,
                                                   first_ts=t0, last_ts=t0 + a.seconds - 1)
        c_raw = time.process_time()
        rows, h = states[(s, v)]
        passes = []
        for _ in range(max(1, a.repeat)):
            c1 = time.process_time()
            got = analyze(meta, from_states(rows, list(range(s))), h, th=th, first_ts=t0, last_ts=t0 + a.seconds - 1)
            passes.append(time.process_time() - c1)
        raw_cpu += c_raw - c0
        for k, t in enumerate(passes):
            pass_cpu[k] += t
        by_size.setdefault(s, []).append(float(np.median(passes)))
        rows_total += len(rows)
        flags = [(x.kind, x.scope) for x in got.findings]
        if out:
            out.write(json.dumps([got.report, flags], sort_keys=True) + "\n")
        same += ref is not None and json.dumps(ref.report, sort_keys=True) == json.dumps(got.report, sort_keys=True) \
            and [(x.kind, x.scope) for x in ref.findings] == flags
    if out:
        out.close()
    feat_cpu = float(np.median(pass_cpu))
    print(f"fleet: {total:,} GPUs in {len(sizes):,} jobs, {a.seconds:,} s at 1 Hz = {total * a.seconds / 1e6:.1f} M "
          f"GPU-samples = {rows_total:,} GPU-minute states")
    if not a.features_only:
        print(f"analysis CPU from raw samples (before):      {raw_cpu:6.2f} s")
    print(f"analysis CPU from minute features (now):     {feat_cpu:6.2f} s  ("
          + ("" if a.features_only else f"{raw_cpu / feat_cpu:.1f}x less; ")
          + f"goal <= 1.5 s for 10,000 GPUs = {1e3 * 1.5 / len(sizes) * total / 10_000:.2f} ms per job here)")
    if len(pass_cpu) > 1:
        print(f"  median of {len(pass_cpu)} passes; each: {', '.join(f'{t:.2f}' for t in pass_cpu)} s")
    for s in sorted(by_size):
        js = by_size[s]
        print(f"  {s:3d}-GPU jobs: {len(js):4d}, {1e3 * sum(js) / len(js):6.2f} ms CPU per job, "
              f"{1e3 * sum(js) / len(js) / s:6.2f} ms per GPU, {100 * sum(js) / feat_cpu:4.1f}% of the total")
    if not a.features_only:
        print(f"reports identical: {same} of {len(sizes)} jobs")
    print(f"(ingest fold of the {sum(len(v) for v in pool.values())} distinct sample sets, not in either: "
          f"{fold_cpu:.2f} s CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
