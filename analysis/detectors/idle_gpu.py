"""idle_gpu: every GPU of the job idle for a long stretch (a whole job doing nothing)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..config import KindConfig
from ..windows import episode_mask
from .base import Finding, Found, JobView, Signals, make_finding, r3

KIND = "idle_gpu"
SIGNALS = Signals(needs=("sm_active",), fallback=("gpu_util",), corroborate=("power_w",))


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    critical_after_s: float  # an idle stretch this long is critical (JDS cancels at 120 min)


def _max_or_none(x: np.ndarray) -> float | None:
    return r3(np.nanmax(x)) if np.any(~np.isnan(x)) else None  # not measured: null, never 0


def detect(job: JobView, cfg: Config, found: Found) -> list[Finding]:
    if not job.idle.any():
        return []  # (all_idle needs an idle GPU in the window)
    all_idle = job.valid_k & (job.n_active == 0) & (job.idle.sum(axis=0) > 0)
    det = job.episodes(all_idle, cfg)
    if not det:
        return []
    em = episode_mask(det, job.w.k)
    longest = max(e.windows for e in det.episodes) * job.window_s
    sev = "critical" if longest >= cfg.critical_after_s else None
    f = job.w.f
    return [make_finding(job, KIND, cfg, det, job.idle.astype(float), {
        "sm_active_max": _max_or_none(np.where(job.idle & em[None, :], f.sm, np.nan)),
        "gpu_util_max": _max_or_none(np.where(job.idle & em[None, :], f.gpu_util, np.nan)),
        "idle_gpus": int(job.idle.any(axis=1).sum()), "n_gpus": job.n_gpus,
        "threshold_sm_active": job.general.idle_sm_active}, severity=sev)]
