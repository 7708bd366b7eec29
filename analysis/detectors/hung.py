"""hung: the hardware signature of a stuck kernel or collective.

NVML says a kernel is running all the time (utilisation pinned), yet the SMs do almost
nothing and no tensor, DRAM, NVLink or network traffic moves: a collective waiting for a peer
that never comes, or a kernel spinning on a flag. Judged per minute, so the minimum duration
can sit just above the longest ordinary pause (a 10-minute checkpoint where ranks wait in a
barrier shows the same signature, for at most 10 minutes) and a real hang is still raised
within 15 minutes. When every GPU of the job shows it (a checkpoint leaves the writing rank's
GPU out: it copies, it does not spin), a shorter minimum (``all_gpus_min_duration_s``) holds, so
a whole-job hang is raised within 5 minutes from the hardware alone. Needs gpu_util and
sm_active (without profiling metrics a hang looks like full use: no verdict); tensor, DRAM and
link traffic corroborate where measured."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, cast

import numpy as np

from gpufleet.flagkinds import flag_kinds

from ..config import KindConfig
from ..windows import Detection, median1d
from ..windows import detect as find_episodes
from .base import Finding, Found, JobView, Signals, confidence, r3

KIND = "hung"
SIGNALS = Signals(needs=("gpu_util", "sm_active"), corroborate=("tensor_active", "dram_active", "links", "power_w"))


@dataclass(frozen=True, kw_only=True)
class Config(KindConfig):
    SECTION: ClassVar[str] = KIND
    gpu_util_min: float  # NVML: a kernel resident nearly all the time
    sm_active_max: float  # ... yet the SMs almost empty
    tensor_active_max: float
    dram_active_max: float
    link_bytes_s_max: float  # NVLink / IB per direction: nothing moves
    gpu_share_min: float  # share of the job's GPUs with the signature (a hang stalls every rank)
    critical_after_s: float
    all_gpus_min_duration_s: float = 0.0  # every GPU with the signature: this long suffices (0: off)


def _episodes(per_gpu: np.ndarray, job_hung: np.ndarray, judged_n: np.ndarray, cfg: Config) -> Detection | None:
    """The hung minutes: stretches of ``min_duration_s`` with the share's GPUs quiet, and
    stretches of ``all_gpus_min_duration_s`` with every judged GPU quiet."""
    valid_m = judged_n > 0
    slow = find_episodes(job_hung, valid_m, 60.0, cfg.min_duration_s, cfg.min_fraction)
    fast = None
    if cfg.all_gpus_min_duration_s > 0:
        every = valid_m & (per_gpu.sum(axis=0) == judged_n)
        fast = find_episodes(every, valid_m, 60.0, cfg.all_gpus_min_duration_s, cfg.min_fraction)
    if fast is None:
        return slow
    union = np.zeros(job_hung.shape, dtype=bool)
    for det in (slow, fast):
        for e in det.episodes if det else ():
            union[e.k0:e.k1] = True
    return find_episodes(union, valid_m, 60.0, 0.0, 0.0)


def _minute_mask(job: JobView, cfg: Config) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(GPU-minutes hung, minutes the job is hung, GPUs judged per minute); None when no GPU-minute
    had NVML utilisation that high (a hung minute needs one: the usual case stops here)."""
    m = job.minutes
    if not (m.gpu_util >= cfg.gpu_util_min).any():
        return None
    has = m.n > 0
    quiet = ((m.gpu_util >= cfg.gpu_util_min) & (m.sm <= cfg.sm_active_max)
             & ~(m.tensor > cfg.tensor_active_max) & ~(m.dram > cfg.dram_active_max)
             & ~(m.nvl > cfg.link_bytes_s_max) & ~(m.ib > cfg.link_bytes_s_max))
    judged = has & ~np.isnan(m.gpu_util) & ~np.isnan(m.sm)
    per_gpu = judged & quiet
    den = judged.sum(axis=0)
    job_hung = (den > 0) & (per_gpu.sum(axis=0) >= np.maximum(1, np.ceil(cfg.gpu_share_min * den)))
    return per_gpu, job_hung, den


def detect(job: JobView, cfg: Config, found: Found) -> list[Finding]:
    masks = _minute_mask(job, cfg)
    if masks is None:
        return []
    per_gpu, job_hung, judged_n = masks
    if not job_hung.any():
        return []
    det = _episodes(per_gpu, job_hung, judged_n, cfg)
    if not det:
        return []
    w, m = job.w, job.minutes
    hung_m = np.zeros(job_hung.shape, dtype=bool)
    for e in det.episodes:
        hung_m[e.k0:e.k1] = True
    gpu_m = per_gpu & hung_m[None, :]
    # Minutes -> the windows' claims: the share of each GPU-window's minutes that were hung.
    off = m.b0 - w.b0
    k_of = (np.arange(job_hung.shape[0]) + off) // w.w_min
    claim = np.zeros_like(w.obs_s)
    for k in np.unique(k_of[hung_m]):
        if 0 <= k < w.k:
            claim[:, k] = gpu_m[:, k_of == k].sum(axis=1) / w.w_min
    em = cast("np.ndarray", claim.any(axis=0))  # claim is (G, K): a (K,) array, never a scalar
    claim = np.where(job.judged, np.clip(claim, 0.0, 1.0), 0.0)
    wasted = float((claim * w.obs_s).sum() / 3600.0)
    last = det.episodes[-1]
    current_s = last.windows * 60.0
    longest = max(e.windows for e in det.episodes) * 60.0
    spec = flag_kinds().get(KIND)
    sev = "critical" if longest >= cfg.critical_after_s else (cfg.severity or spec.severity)
    if wasted >= job.general.critical_wasted_gpu_hours:
        sev = "critical"

    def med(x: np.ndarray) -> float | None:
        v = x[gpu_m & ~np.isnan(x)]
        return r3(median1d(v)) if len(v) else None

    lim = job.ctx.limits
    link = None
    if lim.nvlink_bytes_s > 0 and np.any(~np.isnan(m.nvl[gpu_m])):
        link = med(m.nvl / lim.nvlink_bytes_s)
    conf, basis = confidence(job, em)
    evidence = {"gpu_util": med(m.gpu_util), "sm_active": med(m.sm), "tensor_active": med(m.tensor),
                "dram_active": med(m.dram), "link_util": link, "power_w": med(m.power),
                "hung_minutes": round(current_s / 60, 1), "critical_after_minutes": round(cfg.critical_after_s / 60, 1),
                "flagged_minutes": round(det.flagged_s / 60, 1), "judged_minutes": round(det.judged_s / 60, 1),
                "episodes": len(det.episodes), "longest_episode_minutes": round(longest / 60, 1),
                "confidence": conf, "judged_from": basis}
    start = max(job.ctx.first_ts, float((m.b0 + det.episodes[0].k0) * 60))
    end = min(job.ctx.last_ts, float((m.b0 + last.k1) * 60))
    return [Finding(KIND, "", sev, start, end, det.ongoing, round(wasted, 4), evidence,
                    spec.suggestion_for(job.ctx.workload_class), claim, em)]
