"""low_sm_activity: SMs mostly empty and no more specific cause explains it (the generic
diagnosis, so it runs after the specific ones and steps aside where they flagged)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..config import KindConfig
from ..windows import episode_mask, masked_median
from .base import Finding, Found, JobView, make_finding

KIND = "low_sm_activity"
# Causes more specific than "SMs mostly empty": where one flagged, this one stays quiet.
EXPLAINED_BY = ("comm_bound", "input_stall", "memory_underuse", "straggler")


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    sm_active_max: float  # DCGM guide: < 0.5 likely ineffective
    busy_frac_min: float  # steady (not alternating: that is input_stall)


def detect(job: JobView, cfg: Config, found: Found) -> list[Finding]:
    f = job.w.f
    med_sm = masked_median(f.sm, job.active)
    med_busy = masked_median(f.busy_frac, job.active)
    explained = found.explained(job.w.k, *EXPLAINED_BY)
    mask = (job.valid_k & (job.n_active > 0) & (med_sm < cfg.sm_active_max)
            & ~(med_busy < cfg.busy_frac_min) & ~explained)
    det = job.episodes(mask, cfg)
    if not det:
        return []
    em = episode_mask(det, job.w.k)
    claim = np.where(job.active, 1.0 - np.minimum(1.0, np.nan_to_num(f.sm) / job.general.target_sm_active), 0.0)
    return [make_finding(job, KIND, cfg, det, claim, {
        "sm_active": job.stats(f.sm, em), "sm_occupancy": job.stats(f.occ, em),
        "gpu_util": job.stats(f.gpu_util, em), "threshold_sm_active": cfg.sm_active_max})]
