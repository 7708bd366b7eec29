"""crash_loop: the job's processes keep dying and coming back (Kubernetes CrashLoopBackOff, a
Slurm requeue loop, an elastic agent restarting workers): GPU memory falls to almost nothing,
the GPUs sit at 0 through the back-off, then a new process loads and works a few minutes.

Judged from the job's own GPU memory per minute (``analysis/restarts.py``): a restart is the
memory going from loaded to empty and back. A one-off restart (a preemption, a resume from a
checkpoint) is not a loop: it takes ``min_restarts`` of them, recurring (median time between
them at most ``max_period_s``). Waste: the GPU-minutes with the memory gone inside the loop
(the back-off); the work each crash throws away is not counted, having no measure here."""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..config import KindConfig
from ..restarts import empty_minutes, restarts
from ..windows import Detection, Episode, window_sum
from .base import Finding, Found, JobView, Signals, make_finding

KIND = "crash_loop"
SIGNALS = Signals()  # GPU memory only; a job without it has no restart to see (no abstention noted)


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    min_restarts: int  # restarts (memory gone, then back) in the loop
    max_period_s: float  # median time from one restart to the next at most this
    ongoing_periods: float  # the loop is ongoing while the newest restart is this many periods old at most


def detect(job: JobView, cfg: Config, found: Found) -> list[Finding]:
    ms = job.minutes
    if ms.fb.size == 0:
        return []
    rs = restarts(ms.fb)
    if len(rs) < cfg.min_restarts:
        return []
    gaps = [b.back_m - a.back_m for a, b in itertools.pairwise(rs)]
    period_m = statistics.median(gaps) if gaps else float(rs[0].back_m - rs[0].crash_m)
    if period_m * 60 > cfg.max_period_s:
        return []
    w = job.w
    off = ms.b0 - w.b0  # minute index -> window index: (m + off) // w_min
    m_last = int(np.flatnonzero(ms.n.sum(axis=0) > 0)[-1])
    ongoing = (m_last - rs[-1].back_m) <= cfg.ongoing_periods * period_m
    m0, m1 = rs[0].crash_m, m_last if ongoing else rs[-1].back_m
    k0, k1 = (m0 + off) // w.w_min, min(w.k, (m1 + off) // w.w_min + 1)
    if k1 <= k0:
        return []
    det = Detection([Episode(k0, k1, int(job.valid_k[k0:k1].sum()))], ongoing and k1 == w.k,
                    float(job.valid_k[k0:k1].sum()) * job.window_s, float(job.valid_k.sum()) * job.window_s)
    # the claim: per GPU-window, the share of its minutes with the memory gone (the back-off)
    gone = empty_minutes(ms.fb).astype(np.float64)
    lead = max(0, off)
    gone = np.concatenate([np.zeros((gone.shape[0], lead)), gone], axis=1)[:, max(0, -off):]
    gone = gone[:, :w.k * w.w_min]
    claim = window_sum(gone, w.w_min)[:, :w.k] / w.w_min
    if claim.shape[1] < w.k:
        claim = np.concatenate([claim, np.zeros((claim.shape[0], w.k - claim.shape[1]))], axis=1)
    backoff = [r.back_m - r.crash_m for r in rs]
    out = make_finding(job, KIND, cfg, det, claim, {
        "restarts": len(rs), "median_uptime_minutes": round(float(statistics.median(r.up_minutes for r in rs)), 1),
        "median_backoff_minutes": round(float(statistics.median(backoff)), 1),
        "period_minutes": round(float(period_m), 1), "threshold_restarts": cfg.min_restarts})
    # the flag starts at the loop's first crash (the onset), not at its window's start
    out.start_ts = max(job.ctx.first_ts, float((ms.b0 + m0) * 60))
    return [out]
