"""Hand-built telemetry for the verdict tests, written from what the hardware reports (not
from the simulator): columns per sample, NaN where a signal is not measured."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gpufleet.analysis.config import load_thresholds
from gpufleet.analysis.detectors import features_for
from gpufleet.analysis.features import RAW_FIELDS, histograms
from gpufleet.analysis.report import JobAnalysis, JobMeta, analyze
from gpufleet.analysis.workload import WorkloadClass

T0 = 1_790_000_000.0
GIB = 2.0**30
H100 = "NVIDIA H100 80GB HBM3"
Signals = Callable[[np.ndarray, int], dict[str, np.ndarray | float]]


def telemetry(n_gpus: int, minutes: float, interval_s: float, fn: Signals, *, start: float = T0,
              seed: int = 0) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Samples every ``interval_s`` for ``minutes``; ``fn(t, gpu)`` gives each column over the
    times ``t`` (arrays or constants); columns it leaves out are not measured (NaN)."""
    rng = np.random.default_rng(seed)
    t = start + interval_s * np.arange(1, int(minutes * 60 / interval_s) + 1) + rng.uniform(0, 0.01)
    ts, gpu, cols = [], [], {k: [] for k in RAW_FIELDS}
    for g in range(n_gpus):
        vals = fn(t - start, g)
        ts.append(t)
        gpu.append(np.full(len(t), g))
        for k in RAW_FIELDS:
            v = vals.get(k)
            cols[k].append(np.full(len(t), np.nan) if v is None else np.broadcast_to(np.asarray(v, float), t.shape))
    return (np.concatenate(ts), np.concatenate(gpu), {k: np.concatenate(v) for k, v in cols.items()})


def run(n_gpus: int, minutes: float, interval_s: float, fn: Signals, *, model: str | None = H100,
        until_min: float | None = None, running: bool = False, nodes: list[str] | None = None,
        workload: WorkloadClass | None = None) -> JobAnalysis:
    ts, gpu, cols = telemetry(n_gpus, minutes, interval_s, fn)
    if until_min is not None:
        keep = ts <= T0 + until_min * 60
        ts, gpu, cols = ts[keep], gpu[keep], {k: v[keep] for k, v in cols.items()}
    th = load_thresholds()
    feats = features_for(th, ts, gpu, cols, n_gpus)
    nodes = nodes or ["node-a"] * n_gpus
    meta = JobMeta(job_id="v", start_ts=T0, end_ts=None if running else float(ts.max()), running=running,
                   gpu_uuids=[f"GPU-{g}" for g in range(n_gpus)], gpu_nodes=nodes,
                   gpu_indexes=list(range(n_gpus)), model=model, workload=workload)
    return analyze(meta, feats, histograms(cols), th=th, first_ts=float(ts.min()), last_ts=float(ts.max()))


def kinds(res: JobAnalysis) -> set[str]:
    return {f.kind for f in res.findings}


def healthy_training(t: np.ndarray, g: int) -> dict[str, np.ndarray | float]:
    """A bf16 LLM training step loop: SMs and tensor cores busy, DRAM and NVLink moving."""
    wob = 0.03 * np.sin(t / 7.0 + g)
    return {"sm_active": 0.88 + wob, "sm_occupancy": 0.45, "tensor_active": 0.45 + wob, "dram_active": 0.5,
            "gpu_util": 1.0, "fp32_active": 0.05, "fp64_active": 0.0, "power_w": 640.0, "sm_clock_mhz": 1980.0,
            "clock_event_reasons": 0.0, "fb_used_bytes": 70 * GIB, "fb_total_bytes": 80 * GIB,
            "nvlink_tx_bytes_s": 6e10, "nvlink_rx_bytes_s": 6e10, "ib_tx_bytes_s": 0.0, "ib_rx_bytes_s": 0.0,
            "xid_last": 0.0, "ecc_dbe_volatile": 0.0, "row_remap_failure": 0.0, "nvlink_error_count": 0.0,
            "pcie_replay_count": 0.0}
