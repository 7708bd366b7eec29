"""One job's features -> its efficiency report and flag findings (pure numpy; the entry point
the DB runner, the bench and the tests call)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from gpufleet.catalog import CATALOG

from .config import Thresholds, load_thresholds
from .detectors import Finding, JobContext, JobView, run_detectors
from .detectors.base import CounterMinutes, MinuteSignals
from .features import HIST_FIELDS, MinuteFeatures, hist_quantiles
from .ledger import Ledger, ServingCell, fold_job
from .progress.model import Window
from .windows import build_windows, nz
from .workload import WorkloadClass, from_pattern

MFU_BASIS = "tensor_active x peak dense bf16 (estimate)"
REPORT_VERSION = 3  # 3: goodput and waste from the GPU-time ledger (2: goodput_score a ratio 0..1)


@dataclass(frozen=True)
class JobMeta:
    job_id: str
    start_ts: float | None  # scheduler's start (None: first sample)
    end_ts: float | None  # None while running
    running: bool
    gpu_uuids: list[str]
    gpu_nodes: list[str]
    gpu_indexes: list[int]
    model: str | None
    workload: WorkloadClass | None = None  # from scheduler metadata (analysis/workload.py)


@dataclass
class JobAnalysis:
    report: dict[str, Any]
    findings: list[Finding]
    goodput_score: float | None
    allocated_gpu_hours: float
    wasted_gpu_hours: float
    ledger: Ledger | None = None  # per GPU-minute (analysis/ledger.py): what the runner stores


def _r(x: Any, nd: int = 4) -> float | None:
    if x is None:
        return None
    v = float(x)
    return round(v, nd) if math.isfinite(v) else None  # math, not numpy: a report rounds ~100 of these


def _rs(xs: Iterable[float | None], nd: int = 4) -> list[float | None]:
    """``_r`` of each (a list comprehension: a 32-GPU report rounds ~250 of these)."""
    return [round(v, nd) if v is not None and math.isfinite(v) else None for v in xs]


def _weighted_mean(x: np.ndarray, n: np.ndarray, n_pos: np.ndarray | None = None) -> float | None:
    ok = ~np.isnan(x) & (n > 0 if n_pos is None else n_pos)
    nk = n[ok]
    w = nk.sum()
    return float((x[ok] * nk).sum() / w) if w > 0 else None


def analyze(meta: JobMeta, feats: MinuteFeatures, hist: dict[str, np.ndarray], *,
            th: Thresholds | None = None, events: list[tuple[float, int | None, str, int | None]] | None = None,
            first_ts: float | None = None, last_ts: float | None = None, fabric: Any = None,
            progress: Sequence[Window] | None = None, price: float | None = None,
            serving: Sequence[ServingCell] | None = None) -> JobAnalysis:
    """The report and findings for one job. ``first_ts``/``last_ts``: its first and last
    sample (default: the edges of the minutes with data); ``progress``: the job's progress
    windows (docs/progress.md), folded into its ledger; ``price``: of one GPU-hour (cost);
    ``serving``: its serving replica-minutes (docs/serving.md, "Ledger"), folded too."""
    th = th or load_thresholds()
    g = len(meta.gpu_uuids)
    if first_ts is None or last_ts is None:
        has = np.flatnonzero(feats.n.sum(axis=0) > 0) if feats.n.size else np.zeros(0, dtype=int)
        if first_ts is None:
            first_ts = float((feats.b0 + has[0]) * 60) if len(has) else (meta.start_ts or 0.0)
        if last_ts is None:
            last_ts = float((feats.b0 + has[-1] + 1) * 60) if len(has) else first_ts
    start = meta.start_ts if meta.start_ts is not None else first_ts
    end = meta.end_ts if (meta.end_ts is not None and not meta.running) else last_ts
    end = max(end, start)
    allocated = g * (end - start) / 3600.0
    model = CATALOG.gpu_model(meta.model) if meta.model else None
    ctx = JobContext(meta.gpu_uuids, meta.gpu_nodes, meta.model, th.model(meta.model), first_ts, last_ts,
                     meta.workload.name if meta.workload else None)

    findings: list[Finding] = []
    job: JobView | None = None
    abstained: dict[str, str] = {}
    if feats.n.size and feats.n.sum() > 0:
        w = build_windows(feats, th.general.window_s, th.general.min_window_coverage)
        if ctx.workload_class is None:
            inferred = from_pattern(w.f.busy_frac, w.valid, feats.f["fb_used_max"])  # a crash loop is never serving
            if inferred is not None:
                meta = replace(meta, workload=inferred)
                ctx = replace(ctx, workload_class=inferred.name)
        job = JobView(w, CounterMinutes.of(feats), MinuteSignals.of(feats), ctx, th, events or [], fabric=fabric)
        found = run_detectors(job)
        findings = found.findings
        abstained = {k: f"needs {', '.join(v)}" for k, v in found.abstained.items()}
    # Ended jobs: nothing is going on any more.
    for fd in findings:
        fd.ongoing = fd.ongoing and meta.running

    n = feats.n
    stats: dict[str, dict[str, float | None]] = {}
    n_pos = n > 0  # (every field's mean asks)
    for name, feat in HIST_FIELDS.items():
        h = hist.get(name)
        p50, p95 = hist_quantiles(h, (0.5, 0.95)) if h is not None else (None, None)
        stats[name] = {"mean": _r(_weighted_mean(feats.f[feat], n, n_pos)) if n.size else None, "p50": p50,
                       "p95": p95}

    # Active GPU-hours: the allocated time scaled by the share of observed GPU time not idle.
    active_share = None
    coverage: dict[str, Any] | None = None
    if job is not None:
        coverage = job.coverage.as_json()
        valid_obs = float(job.w.obs_s[job.judged].sum())
        if valid_obs > 0:
            active_share = float(job.w.obs_s[job.judged & ~job.idle].sum()) / valid_obs
    # Every waste figure and the score are sums over the ledger (docs/goodput.md, "The ledger"):
    # a flag's waste is its share of it, two flags never claim one second, and the score is
    # productive / observed GPU time (unobserved time is unknown, neither good nor waste).
    led, led_json = fold_job(meta.gpu_uuids, meta.gpu_nodes, start, end, feats, findings, job, progress, price,
                             serving)
    score = led_json["goodput"]
    wasted_total = float(led_json["wasted_gpu_hours"])
    wasted_by: dict[str, float] = {}
    for fd, secs in zip(findings, led.flag_s, strict=True):
        fd.wasted_gpu_hours = round(secs / 3600.0, 4)
        wasted_by[fd.kind] = round(wasted_by.get(fd.kind, 0.0) + secs / 3600.0, 4)
    tensor_mean = stats["tensor_active"]["mean"]
    peak = model.peak_tensor_tflops if model else None
    achieved = _r(tensor_mean * peak * g, 1) if (peak and tensor_mean is not None) else None
    mfu = {"estimate": _r(tensor_mean), "achieved_tflops": achieved,
           "peak_tflops": _r(peak * g, 1) if peak else None, "peak_tflops_per_gpu": peak, "basis": MFU_BASIS}

    def gpu_means(names: tuple[str, ...], weight: np.ndarray) -> dict[str, list[float | None]]:
        x = np.array([feats.f[k] for k in names])  # one numpy pass for all (np.array: np.stack's, ~3x faster)
        ok = ~np.isnan(x) & (weight > 0)
        w = np.where(ok, weight, 0.0).sum(axis=-1)
        m = np.where(ok, x * weight, 0.0).sum(axis=-1) / np.where(w > 0, w, 1.0)
        have = (w > 0).tolist()
        return {k: [v if h else None for v, h in zip(m[j].tolist(), have[j], strict=True)] for j, k in enumerate(names)}

    # by samples, and the busy clock by busy samples: one pass, the weights side by side
    names = ("sm", "tensor", "dram", "occ", "power", "clock", "clock_busy")
    cols = gpu_means(names, np.array([*(n,) * (len(names) - 1), nz(feats.f["nb"])]))
    fbm = feats.f["fb_used_max"]
    fb_max = [None if v != v else v for v in np.fmax.reduce(fbm, axis=1).tolist()] if fbm.shape[1] else [None] * g
    samples = (n.sum(axis=1) if n.size else np.zeros(g)).tolist()
    clock = [b if b is not None else c for b, c in zip(cols["clock_busy"], cols["clock"], strict=True)]
    per_gpu = [{"gpu_uuid": uuid, "node": node, "index": index, "sm_active_mean": sm, "tensor_active_mean": tensor,
                "dram_active_mean": dram, "sm_occupancy_mean": occ, "power_w_mean": power, "sm_clock_mhz_mean": ck,
                "fb_used_bytes_max": fb, "samples": int(ns)}
               for uuid, node, index, sm, tensor, dram, occ, power, ck, fb, ns in zip(
                   meta.gpu_uuids, meta.gpu_nodes, meta.gpu_indexes, _rs(cols["sm"]), _rs(cols["tensor"]),
                   _rs(cols["dram"]), _rs(cols["occ"]), _rs(cols["power"], 1), _rs(clock, 1), _rs(fb_max, 0), samples,
                   strict=True)]

    active_hours = allocated * active_share if active_share is not None else 0.0
    notes = []
    if feats.interval_s > 2.5:
        notes.append(f"samples every {feats.interval_s:g} s: input_stall (the busy/idle alternation) needs <= 2 s "
                     "sampling; a stalled job shows as low_sm_activity instead")
    if job is not None and not job.w.valid.any():
        # Every window is too thinly sampled to judge (a job shorter than one window, or one
        # just started): that is not "metrics missing", which the coverage note would claim.
        g_ = th.general
        notes.append(f"no {g_.window_s / 60:g}-minute window has {g_.min_window_coverage:.0%} of its time sampled "
                     f"yet ({max(0.0, last_ts - first_ts):.0f} s of samples): too short to judge, no flag")
    else:
        cov_note = job.coverage.note() if job is not None else None
        if cov_note:
            notes.append(cov_note)
        if job is not None and not job.judged.any():
            notes.append("no window had an activity signal (sm_active or gpu_util): nothing judged, no flag")
    report = {
        "version": REPORT_VERSION,
        "job_id": meta.job_id,
        "window": {"start": _r(start, 3), "end": _r(end, 3)},
        "samples_window": {"first": _r(first_ts, 3), "last": _r(last_ts, 3)},
        "n_gpus": g,
        "gpu_model": meta.model,
        "allocated_gpu_hours": _r(allocated),
        "active_gpu_hours": _r(active_hours),
        "goodput_score": score,
        "stats": stats,
        "mfu": mfu,
        "wasted_gpu_hours": wasted_by,
        "wasted_gpu_hours_total": _r(wasted_total),
        "flags": [{"kind": f.kind, "scope": f.scope, "severity": f.severity, "open": f.ongoing,
                   "wasted_gpu_hours": f.wasted_gpu_hours} for f in findings],
        "per_gpu": per_gpu,
        "sample_interval_s": _r(feats.interval_s, 3),
        "coverage": coverage,
        "abstained": abstained,
        "workload": (meta.workload or WorkloadClass(None, "not known")).as_json(),
        "notes": notes,
        "ledger": led_json,
    }
    return JobAnalysis(report, findings, score, round(allocated, 4), round(wasted_total, 4), led)
