"""memory_underuse: a tiny workload on a big GPU (little memory of the device, little activity).

Memory is judged relative to the device's own total (``fb_total_bytes``; for a MIG slice that
is the slice's memory), never an absolute size: 8 GiB is a lot on a 1g.10gb slice and little
on an 80 GB H100. No total reported: no verdict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..config import KindConfig
from ..windows import episode_mask, nz
from .base import Finding, Found, JobView, Signals, make_finding, r3

KIND = "memory_underuse"
SIGNALS = Signals(needs=("sm_active", "fb_total_bytes"), fallback=("gpu_util", "fb_total_bytes"))


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    sm_active_max: float  # JDS: util < 20%
    fb_used_share_max: float  # JDS: <= 10 GB of an 80 GB GPU = 12.5% of the device


def detect(job: JobView, cfg: Config, found: Found) -> list[Finding]:
    f = job.w.f
    with np.errstate(invalid="ignore", divide="ignore"):
        used_share = np.where(job.active & (f.fb_total > 0), f.fb_used_max / f.fb_total, np.nan)
    share_max = np.fmax.reduce(used_share, axis=0) if used_share.shape[0] else np.full(job.w.k, np.nan)
    small = share_max <= cfg.fb_used_share_max
    if not small.any():
        return []  # no window with that little memory used: the activity medians are not needed
    med_sm = job.active_medians(job.activity)[0]  # gpu_util (an upper bound) without profiling
    mask = job.any_active_k & (med_sm < cfg.sm_active_max) & small
    det = job.episodes(mask, cfg)
    if not det:
        return []
    em = episode_mask(det, job.w.k)
    fb = np.where(job.active & em[None, :], f.fb_used_max, np.nan)
    total = np.where(job.active & em[None, :], f.fb_total, np.nan)
    claim = np.where(job.active, 1.0 - np.minimum(1.0, nz(job.activity) / job.general.target_sm_active),
                     0.0)
    return [make_finding(job, KIND, cfg, det, claim, {
        "fb_used_max_gib": r3(np.nanmax(fb) / 2**30, 2), "fb_total_gib": r3(np.nanmax(total) / 2**30, 1),
        "fb_used_share": r3(np.nanmax(share_max[em])), "sm_active": job.stats(f.sm, em),
        "threshold_fb_used_share": cfg.fb_used_share_max, "threshold_sm_active": cfg.sm_active_max})]
