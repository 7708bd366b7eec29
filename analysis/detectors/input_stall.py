"""input_stall: GPUs alternating between running hard and waiting for the next batch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..config import KindConfig
from ..windows import episode_mask, nz, nz_ge, share
from .base import Finding, Found, JobView, Signals, make_finding, r3

KIND = "input_stall"
SIGNALS = Signals(needs=("sm_active",))


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    busy_frac_min: float  # alternating: busy some of the time ...
    busy_frac_max: float  # ... and idle some of the time
    transitions_per_min_min: float  # busy<->idle switches per minute
    busy_sm_active_min: float  # when it runs, it runs hard
    gpu_share_min: float


def detect(job: JobView, cfg: Config, found: Found) -> list[Finding]:
    if job.ctx.workload_class == "serving":
        return []  # a replica idling between requests waits for traffic, not for a DataLoader
    f = job.w.f
    bf = f.busy_frac
    per_gpu = (job.active & (bf >= cfg.busy_frac_min) & (bf <= cfg.busy_frac_max)
               & nz_ge(f.trans_rate, cfg.transitions_per_min_min) & nz_ge(f.busy_sm, cfg.busy_sm_active_min))
    if cfg.gpu_share_min > 0 and not per_gpu.any():
        return []  # no GPU-window qualifies: no share reaches a positive minimum, no episode
    det = job.episodes(job.any_active_k & (share(per_gpu, job.active) >= cfg.gpu_share_min), cfg)
    if not det:
        return []
    em = episode_mask(det, job.w.k)
    job.active_medians(f.trans_rate, f.busy_frac, f.busy_sm, f.sm)  # the evidence's, in one call
    claim = np.where(per_gpu, 1.0 - nz(bf), 0.0)
    tr = job.stats(f.trans_rate, em)
    return [make_finding(job, KIND, cfg, det, claim, {
        "busy_fraction": job.stats(f.busy_frac, em), "sm_active_when_busy": job.stats(f.busy_sm, em),
        "switches_per_minute": tr, "period_s": r3(120.0 / tr, 1) if tr else None,
        "sm_active": job.stats(f.sm, em), "pcie_rx_bytes_s": job.stats(f.pcie_rx, em, per_gpu)})]
