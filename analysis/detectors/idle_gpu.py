"""idle_gpu: every GPU of the job idle for a long stretch (a whole job doing nothing), or one
GPU idle through most of the job while its peers work (scope: that GPU's uuid).

The per-GPU verdict covers what ``oversized_allocation`` leaves: that kind needs a quarter of
the GPUs idle, so one forgotten GPU of eight (a context open, SM 0 for hours) was lost in the
job's score with no flag and no wasted GPU-hours. Windows where the idle share reaches
``oversized_allocation``'s minimum are that kind's, and windows where every GPU idles are the
job-wide finding's, so no GPU-window is claimed twice."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..config import KindConfig
from ..windows import Detection, episode_mask, share
from ..windows import detect as detect_episodes
from . import oversized_allocation
from .base import Finding, Found, JobView, Signals, make_finding, r3

KIND = "idle_gpu"
SIGNALS = Signals(needs=("sm_active",), fallback=("gpu_util",), corroborate=("power_w",))


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    critical_after_s: float  # an idle stretch this long is critical (JDS cancels at 120 min)
    gpu_min_duration_s: float = 3600.0  # one GPU of a working job: idle this long in one stretch ...
    gpu_min_fraction: float = 0.5  # ... and idle in this share of the windows it was judged in


def _max_or_none(x: np.ndarray) -> float | None:
    return r3(np.nanmax(x)) if np.any(~np.isnan(x)) else None  # not measured: null, never 0


def detect(job: JobView, cfg: Config, found: Found) -> list[Finding]:
    if not job.idle.any():
        return []  # (all_idle needs an idle GPU in the window)
    all_idle = job.valid_k & (job.n_active == 0) & (job.idle.sum(axis=0) > 0)
    det = job.episodes(all_idle, cfg)
    out = [_whole_job(job, cfg, det)] if det else []
    return out + _single_gpus(job, cfg)


def _single_gpus(job: JobView, cfg: Config) -> list[Finding]:
    """One finding per GPU idle for most of the job while some peer works, in the windows
    that neither the job-wide finding nor ``oversized_allocation`` would claim."""
    if job.n_gpus < 2:
        return []
    over = job.th.get(oversized_allocation.Config).min_idle_share
    few_idle = share(job.idle, job.judged) < over if over > 0 else np.zeros(job.w.k, dtype=bool)
    mine = job.idle & (job.any_active_k & few_idle)[None, :]
    out = []
    for g in np.flatnonzero(mine.any(axis=1)).tolist():
        det = detect_episodes(mine[g], job.judged[g], job.window_s, cfg.gpu_min_duration_s, cfg.gpu_min_fraction)
        if det is None:
            continue
        em = episode_mask(det, job.w.k)
        claim = np.zeros_like(job.activity)
        claim[g] = mine[g]
        f = job.w.f
        peers = job.active & em[None, :]
        out.append(make_finding(job, KIND, cfg, det, claim, {
            "sm_active_max": _max_or_none(np.where(mine[g] & em, f.sm[g], np.nan)),
            "gpu_util_max": _max_or_none(np.where(mine[g] & em, f.gpu_util[g], np.nan)),
            "idle_gpus": 1, "n_gpus": job.n_gpus, "gpu_uuid": job.ctx.gpu_uuids[g],
            "active_sm_active": job.stats(f.sm, em, peers) if peers.any() else None,
            "threshold_sm_active": job.general.idle_sm_active}, scope=job.ctx.gpu_uuids[g]))
    return out


def _whole_job(job: JobView, cfg: Config, det: Detection) -> Finding:
    em = episode_mask(det, job.w.k)
    longest = max(e.windows for e in det.episodes) * job.window_s
    sev = "critical" if longest >= cfg.critical_after_s else None
    f = job.w.f
    return make_finding(job, KIND, cfg, det, job.idle.astype(float), {
        "sm_active_max": _max_or_none(np.where(job.idle & em[None, :], f.sm, np.nan)),
        "gpu_util_max": _max_or_none(np.where(job.idle & em[None, :], f.gpu_util, np.nan)),
        "idle_gpus": int(job.idle.any(axis=1).sum()), "n_gpus": job.n_gpus,
        "threshold_sm_active": job.general.idle_sm_active}, severity=sev)
