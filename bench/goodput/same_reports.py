"""Random jobs that trigger every window detector, analyzed by whichever gpufleet is first on
the path: write each job's report, findings, evidence and claim matrices as JSON lines, so two
trees (before and after a change to the analysis) can be compared byte for byte.

    PYTHONPATH=/tmp/before .venv/bin/python bench/goodput/same_reports.py --out /tmp/before.jsonl
    .venv/bin/python bench/goodput/same_reports.py --out /tmp/after.jsonl
    cmp /tmp/before.jsonl /tmp/after.jsonl

(docs/benchmarks.md shows how to get the older tree as an importable package.) The bench
fleet (features_bench.py) only raises low_sm_activity; these jobs inject what the other
detectors look for: clock deficits and busier GPUs or nodes (straggler, pipeline_imbalance),
throttle reasons, idle and hung GPUs, busy/idle alternation, saturated links, small memory,
no tensor math, NaN gaps and missing signals (gpu_util-only GPUs), coarse sampling, error
counters, critical XIDs and agent events, ended jobs and workload classes. Each job is analyzed
from the ingest fold's states (what the runner reads) and from raw samples (the reference
fold). The last line counts the findings per kind, to show what was covered."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from gpufleet.analysis.config import load_thresholds
from gpufleet.analysis.detectors import features_for
from gpufleet.analysis.features import HIST_BINS, HIST_FIELDS, RAW_FIELDS, READ_COLUMNS, from_states, histograms
from gpufleet.analysis.report import JobMeta, analyze
from gpufleet.analysis.workload import WorkloadClass
from gpufleet.storage.minute_features import fold

MODELS = ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", None)


def _span(rng: np.random.Generator, n: int) -> slice:
    a = int(rng.integers(0, max(1, n - 5)))
    return slice(a, int(rng.integers(a + 1, n + 1)))


def make_job(rng: np.random.Generator, t0: float) -> tuple[int, np.ndarray, np.ndarray, dict[str, np.ndarray],
                                                            list[tuple[float, int | None, str, int | None]],
                                                            dict[str, Any]]:
    g = int(rng.choice([1, 2, 3, 4, 8, 8, 16, 32]))
    interval = float(rng.choice([1.0, 1.0, 2.0, 5.0, 15.0]))
    steps = int(rng.integers(20, 100) * 60 / interval)
    n = g * steps
    ts = np.tile(t0 + interval * np.arange(steps, dtype=np.float64), g) + rng.uniform(0, 0.05, n)
    gpu = np.repeat(np.arange(g), steps)
    at = np.tile(np.arange(steps), g)  # each row's step
    ro = gpu  # each row's GPU
    level = rng.uniform(0.0, 1.0, g) * rng.choice([0.3, 1.0]) + rng.uniform(0, 0.2)
    sm = np.clip(level[ro] + rng.normal(0, rng.uniform(0.01, 0.1), n), 0, 1)
    cols = {f: np.clip(rng.normal(rng.uniform(0, 0.6), 0.1, n), 0, 1) for f in RAW_FIELDS}
    cols["sm_active"] = sm
    cols["gpu_util"] = np.clip(sm + rng.uniform(0, 0.3), 0, 1)
    cols["sm_clock_mhz"] = np.where(sm > 0.05, 1980.0, 345.0) + rng.normal(0, 5, n)
    cols["clock_event_reasons"] = np.where(sm > 0.05, 0.0, 1.0)
    cols["fb_used_bytes"] = np.full(n, rng.uniform(1e9, 70e9))
    cols["fb_total_bytes"] = np.full(n, 80.0 * 2**30)
    cols["power_w"] = 100 + 500 * sm
    for f in ("nvlink_tx_bytes_s", "nvlink_rx_bytes_s", "ib_tx_bytes_s", "ib_rx_bytes_s", "pcie_rx_bytes_s"):
        cols[f] = rng.uniform(0, 2e10, n)
    for f in ("xid_last", "row_remap_failure"):
        cols[f] = np.zeros(n)
    for f in ("ecc_dbe_volatile", "nvlink_error_count", "pcie_replay_count"):
        cols[f] = np.repeat(rng.integers(0, 50, g).astype(np.float64), steps)
    some = rng.random(g) < rng.uniform(0.1, 0.6)  # the GPUs (or node) an injection hits
    if not some.any():
        some[int(rng.integers(g))] = True
    if g >= 8 and rng.random() < 0.5:  # a whole node
        some = (np.arange(g) // 8) == int(rng.integers(g // 8))
    hit = some[ro]
    tspan = _span(rng, steps) if rng.random() < 0.6 else slice(0, steps)  # sometimes the whole job
    when = np.zeros(steps, dtype=bool)
    when[tspan] = True
    at_t = when[at]
    sel = hit & at_t
    tricks = [t for t in ("deficit", "busier", "throttle", "idle", "hung", "stall", "links", "small_fb", "no_tensor",
                          "fp64", "gaps", "no_prof", "no_signal", "ecc", "xid", "nvlink", "replay", "events", "swing")
              if rng.random() < 0.2]
    if "deficit" in tricks:
        cols["sm_clock_mhz"][sel] *= rng.uniform(0.6, 0.9)
    if "busier" in tricks:
        cols["sm_active"][sel] = np.clip(cols["sm_active"][sel] + rng.uniform(0.1, 0.5), 0, 1)
    if "throttle" in tricks:
        cols["sm_clock_mhz"][sel] *= rng.uniform(0.4, 0.8)
        cols["clock_event_reasons"][sel] = float(rng.choice([0x4, 0x8, 0x20, 0x40, 0x80, 0x8 | 0x40, 0x4 | 0x80]))
    if "idle" in tricks:
        for f in ("sm_active", "gpu_util", "tensor_active", "sm_occupancy"):
            cols[f][sel] = 0.0
    if "hung" in tricks:
        sel2 = at_t if rng.random() < 0.7 else sel
        cols["gpu_util"][sel2], cols["sm_active"][sel2] = 1.0, 0.02
        for f in ("tensor_active", "dram_active", "nvlink_tx_bytes_s", "nvlink_rx_bytes_s", "ib_tx_bytes_s",
                  "ib_rx_bytes_s"):
            cols[f][sel2] = 0.0
    if "stall" in tricks:
        on = ((at // int(rng.integers(1, 4))) % 2 == 0) & at_t
        cols["sm_active"] = np.where(on, 0.9, np.where(at_t, 0.0, cols["sm_active"]))
    if "links" in tricks:
        cols["nvlink_tx_bytes_s"][at_t] = rng.uniform(3e11, 4.5e11)
        cols["sm_active"][at_t] *= 0.5
    if "small_fb" in tricks:
        cols["fb_used_bytes"][:] = rng.uniform(1e8, 8e9)
        cols["sm_active"] *= rng.uniform(0.05, 0.5)
    if "no_tensor" in tricks:
        cols["tensor_active"][at_t] = rng.uniform(0, 0.02)
        cols["sm_active"][at_t] = np.clip(cols["sm_active"][at_t] + 0.4, 0, 1)
        cols["dram_active"][at_t] = rng.uniform(0.1, 0.7)
        cols["fp64_active"][at_t] = 0.0
    if "fp64" in tricks:
        cols["fp64_active"][sel] = rng.uniform(0.01, 0.3)
    if "gaps" in tricks:
        for _ in range(int(rng.integers(1, 4))):
            gap = np.zeros(steps, dtype=bool)
            gap[_span(rng, steps)] = True
            for f in rng.choice(list(cols), int(rng.integers(1, len(cols)))):
                cols[str(f)][gap[at] & (hit | (rng.random() < 0.5))] = np.nan
    if "no_prof" in tricks:  # NVML only on some GPUs: judged from gpu_util
        for f in ("sm_active", "sm_occupancy", "tensor_active", "dram_active", "fp32_active", "fp64_active"):
            cols[f][hit] = np.nan
    if "no_signal" in tricks:
        for f in rng.choice(["tensor_active", "dram_active", "power_w", "sm_clock_mhz", "fb_total_bytes",
                             "gpu_util", "nvlink_tx_bytes_s", "nvlink_rx_bytes_s", "ib_tx_bytes_s",
                             "ib_rx_bytes_s"], int(rng.integers(1, 5))):
            cols[str(f)][:] = np.nan
    for trick, f, step in (("ecc", "ecc_dbe_volatile", 1.0), ("nvlink", "nvlink_error_count", 200.0),
                           ("replay", "pcie_replay_count", 500.0)):
        if trick in tricks:
            c = cols[f]
            c[sel] += step * rng.integers(1, 4)
            if rng.random() < 0.3:  # a driver reload: the counter restarts
                c[hit & (at > int(rng.integers(steps)))] = 0.0
    if "xid" in tricks:
        cols["xid_last"][sel] = float(rng.choice([79, 48, 63, 13, 94, 119]))
        if rng.random() < 0.5:
            cols["row_remap_failure"][sel] = 1.0
    events: list[tuple[float, int | None, str, int | None]] = []
    if "events" in tricks:
        for _ in range(int(rng.integers(1, 4))):
            kind = str(rng.choice(["xid", "ecc_dbe", "row_remap_failure", "nvlink_error", "fell_off_bus"]))
            row: int | None = int(rng.integers(-1, g + 1)) if rng.random() < 0.9 else None
            code = int(rng.choice([79, 48, 31, 43])) if kind == "xid" else (None if rng.random() < 0.5 else 3)
            events.append((float(t0 + rng.uniform(0, steps * interval)), row, kind, code))
    if "swing" in tricks:  # busy share that follows traffic: the serving pattern
        duty = rng.uniform(0.05, 0.95, steps // max(1, int(300 / interval)) + 1)
        on = rng.random(n) < duty[at // max(1, int(300 / interval))]
        cols["sm_active"] = np.where(on, 0.7, 0.0)
    if rng.random() < 0.25:  # rows missing (an agent down, a GPU that left): minutes without a state
        keep = ~(hit & when[at]) if rng.random() < 0.5 else rng.random(n) > 0.3
        keep[0] = True  # (a job with no row at all is not analyzed)
        ts, gpu, cols = ts[keep], gpu[keep], {k: v[keep] for k, v in cols.items()}
        n = len(ts)
    if rng.random() < 0.3:  # rows out of order, as late batches arrive
        perm = rng.permutation(n)
        ts, gpu, cols = ts[perm], gpu[perm], {k: v[perm] for k, v in cols.items()}
    info = {"g": g, "interval": interval, "steps": steps, "tricks": tricks}
    return g, ts, gpu, cols, events, info


def _finding(f: Any) -> dict[str, Any]:
    claim = np.ascontiguousarray(f.claim, dtype=np.float64)
    return {"kind": f.kind, "scope": f.scope, "severity": f.severity, "start": f.start_ts, "end": f.end_ts,
            "ongoing": f.ongoing, "wasted": f.wasted_gpu_hours, "evidence": f.evidence, "suggestion": f.suggestion,
            "claim": [list(claim.shape), hashlib.sha1(claim.tobytes()).hexdigest()],
            "windows": np.asarray(f.windows, dtype=bool).astype(int).tolist()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=250)
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--out", type=Path, required=True, help="JSON lines: one per job and path")
    a = ap.parse_args(argv)
    th = load_thresholds()
    rng = np.random.default_rng(a.seed)
    kinds: Counter[str] = Counter()
    with a.out.open("w") as out:
        for j in range(a.jobs):
            t0 = 1_790_000_000.0 + float(rng.integers(0, 3600))
            g, ts, gpu, cols, events, info = make_job(rng, t0)
            running = bool(rng.random() < 0.7)
            workload = None if rng.random() < 0.6 else WorkloadClass(str(rng.choice(["training", "serving", "hpc"])),
                                                                      "bench")
            meta = JobMeta(job_id=str(j), start_ts=t0 - float(rng.choice([0.0, 30.0])),
                           end_ts=None if running else float(ts.max()) + 1, running=running,
                           gpu_uuids=[f"GPU-{j}-{k}" for k in range(g)],
                           gpu_nodes=[f"n{j}-{(k if rng.random() < 0.1 else k // 8)}" for k in range(g)],
                           gpu_indexes=[k % 8 for k in range(g)], model=MODELS[j % len(MODELS)], workload=workload)
            first, last = float(ts.min()), float(ts.max())
            f = fold(ts, gpu, np.zeros(len(ts), np.int64), cols)
            rows = np.column_stack([{"bucket": f.bucket, "gpu_pk": f.gpu_pk, **f.cols}[c] for c in READ_COLUMNS])
            tot = f.hist.sum(axis=0)
            hist = {name: tot[k * HIST_BINS:(k + 1) * HIST_BINS] for k, name in enumerate(HIST_FIELDS)}
            for path, feats, h in (("states", from_states(rows, list(range(g))), hist),
                                   ("raw", features_for(th, ts, gpu, cols, g), histograms(cols))):
                got = analyze(meta, feats, h, th=th, events=events, first_ts=first, last_ts=last)
                kinds.update(x.kind for x in got.findings if path == "states")
                out.write(json.dumps({"job": j, "path": path, "info": info, "report": got.report,
                                      "score": got.goodput_score, "wasted": got.wasted_gpu_hours,
                                      "findings": [_finding(x) for x in got.findings]}, sort_keys=True) + "\n")
    print(f"{a.jobs} jobs x 2 paths, analysis from {Path(analyze.__code__.co_filename).parent} -> {a.out}\n"
          "findings (states path): "
          + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
