"""low_sm_activity: SMs mostly empty and no more specific cause explains it (the generic
diagnosis, so it runs after the specific ones and steps aside where they flagged).

Judged on the window mean, whatever the sampling interval: a bursty job at 10% SM sampled
every 15 s is as empty as a steady one (the old "steady" condition needed 1 s samples).
Needs profiling metrics (``sm_active``): NVML ``gpu_util`` is a duty cycle, which cannot tell
a bursty job with full SMs from an empty one, and request-driven serving idles by design;
without them only idle GPUs are judged (idle_gpu)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..config import KindConfig
from ..windows import episode_mask, episodes, nz
from .base import Finding, Found, JobView, Signals, make_finding

KIND = "low_sm_activity"
SIGNALS = Signals(needs=("sm_active",))
# Causes more specific than "SMs mostly empty": where one flagged, this one stays quiet.
EXPLAINED_BY = ("idle_gpu", "oversized_allocation", "hung", "comm_bound", "input_stall", "memory_underuse", "straggler",
                "pipeline_imbalance")


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    sm_active_max: float  # DCGM guide: < 0.5 likely ineffective


def detect(job: JobView, cfg: Config, found: Found) -> list[Finding]:
    f = job.w.f
    # Per window: the active GPUs' median; a window where every GPU idles counts as 0, so a
    # bursty job whose coarse samples land between bursts (idle windows interleaved with
    # light ones) is still one low-duty episode. Long idle stretches are idle_gpu's.
    # (Over the active GPUs judged from profiling metrics: the others' sm_active is NaN, which
    # masked_median leaves out anyway, so this is the median over the active GPUs.)
    med = np.where(job.n_active > 0, job.active_medians(f.sm)[0], 0.0)
    explained = found.explained(job.w.k, *EXPLAINED_BY)
    mask = job.valid_k & (med < cfg.sm_active_max) & ~explained
    # ... but a stretch that is idle nearly throughout is idleness, not half-empty SMs: keep
    # only runs where GPUs did some work in at least a quarter of the windows.
    valid, worked = job.valid_k.tolist(), (job.n_active > 0).tolist()  # (Python lists: a job has a dozen windows)
    for e in episodes(mask, job.valid_k):
        run = [k for k in range(e.k0, e.k1) if valid[k]]
        if sum(worked[k] for k in run) * 4 < len(run):
            mask[run] = False
    det = job.episodes(mask, cfg)
    if not det:
        return []
    em = episode_mask(det, job.w.k)
    job.active_medians(f.sm, f.occ, f.gpu_util, f.busy_frac)  # the evidence's, in one call
    claim = np.where(job.judged & ~job.from_util,
                     1.0 - np.minimum(1.0, nz(f.sm) / job.general.target_sm_active), 0.0)
    return [make_finding(job, KIND, cfg, det, claim, {
        "sm_active": job.stats(f.sm, em), "sm_occupancy": job.stats(f.occ, em),
        "gpu_util": job.stats(f.gpu_util, em), "busy_fraction": job.stats(f.busy_frac, em),
        "threshold_sm_active": cfg.sm_active_max})]
